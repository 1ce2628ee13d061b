#include "runtime/dataset.h"

#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

const std::vector<FeedSpec> kMlpFeeds = {{"image", F32, {-1, 784}}, {"label", I64, {-1}}};

std::unique_ptr<Dataset> MustOpen(const std::string& spec, const std::vector<FeedSpec>& feeds, uint64_t seed = 1) {
  absl::StatusOr<std::unique_ptr<Dataset>> ds = OpenDataset(spec, feeds, seed);
  EXPECT_TRUE(ds.ok()) << ds.status();
  return ds.ok() ? *std::move(ds) : nullptr;
}

std::vector<Tensor> MustBatch(const Dataset& ds, std::vector<int64_t> indices) {
  std::vector<Tensor> out;
  absl::Status s = ds.GetBatch(indices, &out);
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

template <typename T>
std::vector<T> Values(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
}

absl::Status OpenError(const std::string& spec, const std::vector<FeedSpec>& feeds = kMlpFeeds) {
  absl::StatusOr<std::unique_ptr<Dataset>> ds = OpenDataset(spec, feeds, 1);
  return ds.status();
}

// ---------------------------------------------------------------------------
// Fashion-MNIST from Debian's dataset-fashion-mnist.

TEST(FashionMnistTest, TrainSplitLoadsWithKnownLabelsAndScaledPixels) {
  std::unique_ptr<Dataset> ds = MustOpen("fashion_mnist", kMlpFeeds);
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->size(), 60000);
  EXPECT_EQ(ds->num_classes(), 10);
  EXPECT_EQ(ds->label_feed(), 1);
  std::vector<Tensor> batch = MustBatch(*ds, {0, 1, 2, 3, 59999});
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].dtype(), F32);
  EXPECT_THAT(batch[0].shape(), ::testing::ElementsAre(5, 784));
  EXPECT_THAT(batch[1].shape(), ::testing::ElementsAre(5));
  // First training labels of Fashion-MNIST: ankle boot, T-shirt, T-shirt, dress.
  std::vector<int64_t> labels = Values<int64_t>(batch[1]);
  EXPECT_THAT(std::vector<int64_t>(labels.begin(), labels.begin() + 4), ::testing::ElementsAre(9, 0, 0, 3));
  // Pixels are byte/255: in [0, 1], both ends reached, each a multiple of 1/255.
  std::vector<float> pixels = Values<float>(batch[0]);
  EXPECT_EQ(*std::min_element(pixels.begin(), pixels.end()), 0.0f);
  EXPECT_EQ(*std::max_element(pixels.begin(), pixels.end()), 1.0f);
  for (float p : pixels) {
    float scaled = p * 255.0f;
    ASSERT_NEAR(scaled, std::round(scaled), 1e-3);
  }
  // The first image's byte sum is 76247 (from Python's gzip module).
  double sum = 0;
  for (int i = 0; i < 784; ++i) sum += std::round(pixels[i] * 255.0f);
  EXPECT_EQ(sum, 76247);
}

TEST(FashionMnistTest, TestSplitLoads) {
  for (const char* spec : {"fashion_mnist:test", "fashion_mnist:test,path=/usr/share/datasets/fashion-mnist"}) {
    std::unique_ptr<Dataset> ds = MustOpen(spec, kMlpFeeds);
    ASSERT_NE(ds, nullptr);
    EXPECT_EQ(ds->size(), 10000) << spec;
    std::vector<Tensor> batch = MustBatch(*ds, {0, 1, 2});
    EXPECT_THAT(Values<int64_t>(batch[1]), ::testing::ElementsAre(9, 2, 1)) << spec;
  }
  std::unique_ptr<Dataset> train = MustOpen("fashion_mnist:train", kMlpFeeds);
  ASSERT_NE(train, nullptr);
  EXPECT_EQ(train->size(), 60000);
  // size=N: the first N samples, the same ones.
  std::unique_ptr<Dataset> first = MustOpen("fashion_mnist:test,size=500", kMlpFeeds);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->size(), 500);
  EXPECT_THAT(Values<int64_t>(MustBatch(*first, {0, 1, 2})[1]), ::testing::ElementsAre(9, 2, 1));
  EXPECT_EQ(Values<float>(MustBatch(*first, {499})[0]),
            Values<float>(MustBatch(*MustOpen("fashion_mnist:test", kMlpFeeds), {499})[0]));
  EXPECT_THAT(std::string(OpenError("fashion_mnist:test,size=10001").message()),
              HasSubstr("size=10001 is more than the 10000 samples of"));
}

TEST(FashionMnistTest, ImageFeedShapesAndDtypesAgree) {
  std::unique_ptr<Dataset> flat = MustOpen("fashion_mnist:test", kMlpFeeds);
  std::unique_ptr<Dataset> nchw = MustOpen("fashion_mnist:test", {{"label", I64, {-1}}, {"x", F64, {-1, 1, 28, 28}}});
  std::unique_ptr<Dataset> hw = MustOpen("fashion_mnist:test", {{"x", F32, {-1, 28, 28}}});
  ASSERT_TRUE(flat && nchw && hw);
  EXPECT_EQ(nchw->label_feed(), 0);
  EXPECT_EQ(hw->label_feed(), -1);
  std::vector<int64_t> indices = {7, 3, 9999, 3};
  std::vector<Tensor> a = MustBatch(*flat, indices), b = MustBatch(*nchw, indices), c = MustBatch(*hw, indices);
  EXPECT_THAT(b[1].shape(), ::testing::ElementsAre(4, 1, 28, 28));
  EXPECT_EQ(b[1].dtype(), F64);
  EXPECT_THAT(c[0].shape(), ::testing::ElementsAre(4, 28, 28));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(Values<int64_t>(a[1]), Values<int64_t>(b[0]));
  std::vector<float> fa = Values<float>(a[0]), fc = Values<float>(c[0]);
  std::vector<double> db = Values<double>(b[1]);
  EXPECT_EQ(fa, fc);
  for (size_t i = 0; i < fa.size(); ++i) ASSERT_EQ(fa[i], static_cast<float>(db[i])) << i;
  // Repeated indices give repeated samples.
  EXPECT_TRUE(std::equal(fa.begin() + 784, fa.begin() + 2 * 784, fa.begin() + 3 * 784));
}

TEST(FashionMnistTest, WrongImageShapeNamesFeedAndAcceptedShapes) {
  absl::Status s = OpenError("fashion_mnist:test", {{"pic", F32, {-1, 3, 32, 32}}, {"label", I64, {-1}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("'pic'"));
  EXPECT_THAT(s.message(), HasSubstr("[-1, 784], [-1, 1, 28, 28] or [-1, 28, 28]"));
}

TEST(FashionMnistTest, TwoImageFeedsAreAnError) {
  absl::Status s = OpenError("fashion_mnist:test", {{"a", F32, {-1, 784}}, {"b", F32, {-1, 784}}});
  EXPECT_THAT(s.message(), HasSubstr("exactly one floating image feed"));
  EXPECT_THAT(s.message(), HasSubstr("a, b"));
}

TEST(FashionMnistTest, BatchIndexOutOfRangeIsAnError) {
  std::unique_ptr<Dataset> ds = MustOpen("fashion_mnist:test", kMlpFeeds);
  ASSERT_NE(ds, nullptr);
  std::vector<Tensor> out;
  std::vector<int64_t> indices = {0, 10000};
  absl::Status s = ds->GetBatch(indices, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(s.message(), HasSubstr("10000"));
  indices = {-1};
  EXPECT_EQ(ds->GetBatch(indices, &out).code(), absl::StatusCode::kOutOfRange);
  // An empty batch is fine.
  indices.clear();
  ASSERT_TRUE(ds->GetBatch(indices, &out).ok());
  EXPECT_THAT(out[0].shape(), ::testing::ElementsAre(0, 784));
}

// ---------------------------------------------------------------------------
// IDX datasets from a directory (mnist:path=, fashion_mnist:path=) on crafted files.

std::string IdxBytes(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& data) {
  std::string s = {0, 0, 8, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) s += static_cast<char>(d >> shift);
  }
  s.append(data.begin(), data.end());
  return s;
}

void WriteFile(const std::string& path, const std::string& bytes, bool gzip) {
  if (gzip) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    gzwrite(f, bytes.data(), bytes.size());
    gzclose(f);
  } else {
    FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr) << path;
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  }
}

// A 3-sample 2x2 dataset; `gzip` picks .gz or plain file names.
std::string MakeTinyIdxDir(const std::string& name, bool gzip, std::vector<uint8_t> labels) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/", name);
  mkdir(dir.c_str(), 0755);
  std::string ext = gzip ? ".gz" : "";
  std::vector<uint8_t> pixels = {0, 255, 51, 102, 1, 2, 3, 4, 10, 20, 30, 40};
  for (const char* split : {"train", "t10k"}) {
    WriteFile(absl::StrCat(dir, "/", split, "-images-idx3-ubyte", ext), IdxBytes({3, 2, 2}, pixels), gzip);
    WriteFile(absl::StrCat(dir, "/", split, "-labels-idx1-ubyte", ext), IdxBytes({3}, labels), gzip);
  }
  return dir;
}

TEST(IdxDatasetTest, ReadsDirectoryGivenByPath) {
  for (bool gzip : {true, false}) {
    std::string dir = MakeTinyIdxDir(gzip ? "tiny_gz" : "tiny_plain", gzip, {4, 0, 9});
    std::vector<FeedSpec> feeds = {{"x", F64, {-1, 1, 2, 2}}, {"y", I64, {-1}}};
    for (const std::string& spec : {absl::StrCat("mnist:path=", dir), absl::StrCat("fashion_mnist:path=", dir, ",test")}) {
      std::unique_ptr<Dataset> ds = MustOpen(spec, feeds);
      ASSERT_NE(ds, nullptr) << spec;
      EXPECT_EQ(ds->size(), 3);
      std::vector<Tensor> batch = MustBatch(*ds, {2, 0});
      EXPECT_THAT(Values<int64_t>(batch[1]), ::testing::ElementsAre(9, 4));
      EXPECT_THAT(Values<double>(batch[0]),
                  ::testing::ElementsAre(10 / 255.0, 20 / 255.0, 30 / 255.0, 40 / 255.0, 0.0, 1.0, 0.2, 0.4));
    }
  }
}

// The forms `strata run --help` shows: options after one ':', in any order.
TEST(IdxDatasetTest, FashionMnistTakesSplitAndPathAfterOneColon) {
  std::string dir = MakeTinyIdxDir("tiny_fashion_forms", false, {4, 0, 9});
  std::vector<FeedSpec> feeds = {{"x", F32, {-1, 4}}, {"y", I64, {-1}}};
  for (const std::string& spec :
       {absl::StrCat("fashion_mnist:path=", dir), absl::StrCat("fashion_mnist:test,path=", dir),
        absl::StrCat("fashion_mnist:path=", dir, ",test"), absl::StrCat("fashion_mnist:train,path=", dir)}) {
    std::unique_ptr<Dataset> ds = MustOpen(spec, feeds);
    ASSERT_NE(ds, nullptr) << spec;
    EXPECT_EQ(ds->size(), 3) << spec;
  }
}

TEST(DatasetSpecTest, ACommaAfterTheNameSaysToWriteAColon) {
  for (const auto& [spec, fixed] : std::vector<std::pair<std::string, std::string>>{
           {"fashion_mnist,path=/data/fm", "fashion_mnist:path=/data/fm"},
           {"fashion_mnist,test,path=/data/fm", "fashion_mnist:test,path=/data/fm"},
           {"synthetic,classes=3", "synthetic:classes=3"},
       }) {
    absl::Status s = OpenError(spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("data spec \"", spec, "\" puts a ',' after the dataset name")));
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("(write \"", fixed, "\")")));
  }
}

TEST(IdxDatasetTest, LabelOutOfRangeNamesFileAndIndex) {
  std::string dir = MakeTinyIdxDir("tiny_bad_label", true, {1, 2, 10});
  absl::Status s = OpenError(absl::StrCat("mnist:path=", dir), {{"x", F32, {-1, 4}}, {"y", I64, {-1}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(dir + "/train-labels-idx1-ubyte.gz"));
  EXPECT_THAT(s.message(), HasSubstr("label 10 at index 2"));
}

TEST(IdxDatasetTest, MissingDirectoryAndMissingPathAreErrors) {
  absl::Status s = OpenError("mnist:path=/nonexistent/mnist", {{"x", F32, {-1, 784}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("/nonexistent/mnist/train-images-idx3-ubyte.gz"));
  s = OpenError("mnist", {{"x", F32, {-1, 784}}});
  EXPECT_THAT(s.message(), HasSubstr("needs path=DIR"));
}

// ---------------------------------------------------------------------------
// Epoch order.

TEST(EpochOrderTest, IsAPermutationThatDependsOnlyOnSeedAndEpoch) {
  std::vector<int64_t> order = EpochOrder(1000, 42, 3);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity);
  EXPECT_NE(order, identity);
  EXPECT_EQ(order, EpochOrder(1000, 42, 3));
  EXPECT_NE(order, EpochOrder(1000, 42, 4));
  EXPECT_NE(order, EpochOrder(1000, 43, 3));
  EXPECT_TRUE(EpochOrder(0, 42, 0).empty());
  EXPECT_THAT(EpochOrder(1, 42, 0), ::testing::ElementsAre(0));
}

TEST(EpochOrderTest, AllPermutationsOfThreeAreAboutEquallyLikely) {
  std::map<std::vector<int64_t>, int> counts;
  for (int epoch = 0; epoch < 6000; ++epoch) ++counts[EpochOrder(3, 7, epoch)];
  EXPECT_EQ(counts.size(), 6u);
  // Expected 1000 each; the standard deviation is about 29.
  for (const auto& [perm, count] : counts) EXPECT_NEAR(count, 1000, 150);
}

// ---------------------------------------------------------------------------
// Synthetic data.

TEST(SyntheticTest, SamplesAreDeterministicAndIndependentOfBatchComposition) {
  std::vector<FeedSpec> feeds = {{"x", F64, {-1, 5}}, {"y", I64, {-1}}};
  std::unique_ptr<Dataset> a = MustOpen("synthetic", feeds, 9), b = MustOpen("synthetic", feeds, 9);
  std::unique_ptr<Dataset> other_seed = MustOpen("synthetic", feeds, 10);
  ASSERT_TRUE(a && b && other_seed);
  EXPECT_EQ(a->size(), 8192);
  EXPECT_EQ(a->num_classes(), 10);
  std::vector<Tensor> big = MustBatch(*a, {3, 5, 7}), single = MustBatch(*b, {5});
  std::vector<double> x = Values<double>(big[0]);
  EXPECT_EQ(std::vector<double>(x.begin() + 5, x.begin() + 10), Values<double>(single[0]));
  EXPECT_EQ(Values<int64_t>(big[1])[1], Values<int64_t>(single[1])[0]);
  EXPECT_NE(Values<double>(MustBatch(*other_seed, {5})[0]), Values<double>(single[0]));
}

TEST(SyntheticTest, FeaturesAreStandardNormal) {
  std::unique_ptr<Dataset> ds = MustOpen("synthetic:size=2000", {{"x", F64, {-1, 100}}});
  ASSERT_NE(ds, nullptr);
  std::vector<int64_t> all(2000);
  std::iota(all.begin(), all.end(), 0);
  std::vector<double> x = Values<double>(MustBatch(*ds, all)[0]);
  double mean = 0, var = 0;
  for (double v : x) mean += v;
  mean /= x.size();
  for (double v : x) var += (v - mean) * (v - mean);
  var /= x.size();
  // 200000 draws: standard errors 0.0022 (mean) and 0.0032 (variance).
  EXPECT_NEAR(mean, 0.0, 0.015);
  EXPECT_NEAR(var, 1.0, 0.02);
}

TEST(SyntheticTest, ClassesAreRoughlyBalanced) {
  for (int64_t features : {4, 784, 3072}) {
    for (int classes : {2, 10}) {
      std::string spec = absl::StrCat("synthetic:classes=", classes);
      std::unique_ptr<Dataset> ds = MustOpen(spec, {{"x", F32, {-1, features}}, {"y", I64, {-1}}}, 1);
      ASSERT_NE(ds, nullptr);
      EXPECT_EQ(ds->num_classes(), classes);
      std::vector<int64_t> all(ds->size());
      std::iota(all.begin(), all.end(), 0);
      std::vector<int64_t> labels = Values<int64_t>(MustBatch(*ds, all)[1]);
      std::vector<int> counts(classes, 0);
      for (int64_t l : labels) {
        ASSERT_GE(l, 0);
        ASSERT_LT(l, classes);
        ++counts[l];
      }
      // Every class appears, none with less than half or more than twice its share.
      const double share = static_cast<double>(ds->size()) / classes;
      for (int k = 0; k < classes; ++k) {
        EXPECT_GT(counts[k], share / 2) << spec << " features=" << features << " class " << k;
        EXPECT_LT(counts[k], share * 2) << spec << " features=" << features << " class " << k;
      }
    }
  }
}

TEST(SyntheticTest, F32FeedsHoldTheF64ValuesRoundedAndTheSameLabels) {
  std::unique_ptr<Dataset> f64 = MustOpen("synthetic:classes=4", {{"x", F64, {-1, 2, 3}}, {"y", I64, {-1}}});
  std::unique_ptr<Dataset> f32 = MustOpen("synthetic:classes=4", {{"y", I64, {-1}}, {"x", F32, {-1, 6}}});
  ASSERT_TRUE(f64 && f32);
  std::vector<int64_t> indices(256);
  std::iota(indices.begin(), indices.end(), 100);
  std::vector<Tensor> a = MustBatch(*f64, indices), b = MustBatch(*f32, indices);
  std::vector<double> xa = Values<double>(a[0]);
  std::vector<float> xb = Values<float>(b[1]);
  ASSERT_EQ(xa.size(), xb.size());
  for (size_t i = 0; i < xa.size(); ++i) ASSERT_EQ(static_cast<float>(xa[i]), xb[i]);
  // The teacher sees the rounded values; a label flip would need a near-tie.
  std::vector<int64_t> la = Values<int64_t>(a[1]), lb = Values<int64_t>(b[0]);
  int same = 0;
  for (size_t i = 0; i < la.size(); ++i) same += la[i] == lb[i];
  EXPECT_GE(same, 255);
}

TEST(SyntheticTest, DefaultClassesComeFromTheCallerAndClassesOverridesThem) {
  const std::vector<FeedSpec> feeds = {{"x", F64, {-1, 4}}, {"y", I64, {-1}}};
  EXPECT_EQ(LabelFeedName(feeds), "y");
  EXPECT_EQ(LabelFeedName({{"x", F64, {-1, 4}}}), "");
  auto program_classes = OpenDataset("synthetic", feeds, 1, 7);
  auto explicit_classes = OpenDataset("synthetic:classes=5", feeds, 1, 7);
  auto no_hint = OpenDataset("synthetic", feeds, 1);
  ASSERT_TRUE(program_classes.ok() && explicit_classes.ok() && no_hint.ok());
  EXPECT_EQ((*program_classes)->num_classes(), 7);
  EXPECT_EQ((*explicit_classes)->num_classes(), 5);
  EXPECT_EQ((*no_hint)->num_classes(), 10);
  int64_t largest = 0;
  for (int64_t i = 0; i < 256; ++i) {
    std::vector<Tensor> batch = MustBatch(**program_classes, {i});
    largest = std::max(largest, Values<int64_t>(batch[1])[0]);
  }
  EXPECT_EQ(largest, 6);  // 256 balanced draws over 7 classes reach the last one
}

TEST(SyntheticTest, FeaturesConcatenateOverSeveralFeeds) {
  std::unique_ptr<Dataset> one = MustOpen("synthetic", {{"x", F64, {-1, 7}}, {"y", I64, {-1}}});
  std::unique_ptr<Dataset> two = MustOpen("synthetic", {{"a", F64, {-1, 3}}, {"y", I64, {-1}}, {"b", F64, {-1, 4}}});
  ASSERT_TRUE(one && two);
  std::vector<Tensor> p = MustBatch(*one, {11}), q = MustBatch(*two, {11});
  std::vector<double> joined = Values<double>(q[0]);
  std::vector<double> tail = Values<double>(q[2]);
  joined.insert(joined.end(), tail.begin(), tail.end());
  EXPECT_EQ(Values<double>(p[0]), joined);
  EXPECT_EQ(Values<int64_t>(p[1]), Values<int64_t>(q[1]));
}

TEST(SyntheticTest, TestSplitIsDisjointButFromTheSameTeacher) {
  std::vector<FeedSpec> feeds = {{"x", F64, {-1, 8}}, {"y", I64, {-1}}};
  std::unique_ptr<Dataset> train = MustOpen("synthetic:classes=3,size=4000", feeds, 5);
  std::unique_ptr<Dataset> test = MustOpen("synthetic:classes=3,size=4000,test", feeds, 5);
  ASSERT_TRUE(train && test);
  std::vector<int64_t> all(4000);
  std::iota(all.begin(), all.end(), 0);
  std::vector<Tensor> tr = MustBatch(*train, all), te = MustBatch(*test, all);
  std::vector<double> xtr = Values<double>(tr[0]), xte = Values<double>(te[0]);
  for (int i = 0; i < 4000; ++i) {
    ASSERT_FALSE(std::equal(xtr.begin() + 8 * i, xtr.begin() + 8 * i + 8, xte.begin() + 8 * i)) << i;
  }
  // Same teacher: a 1-nearest-neighbour rule fitted on train predicts test labels
  // well above chance (1/3).
  auto nn_accuracy = [&](const std::vector<int64_t>& test_labels) {
    std::vector<int64_t> ytr = Values<int64_t>(tr[1]);
    int correct = 0;
    for (int i = 0; i < 500; ++i) {
      double best = HUGE_VAL;
      int64_t pred = -1;
      for (int j = 0; j < 4000; ++j) {
        double d = 0;
        for (int k = 0; k < 8; ++k) d += (xte[8 * i + k] - xtr[8 * j + k]) * (xte[8 * i + k] - xtr[8 * j + k]);
        if (d < best) best = d, pred = ytr[j];
      }
      correct += pred == test_labels[i];
    }
    return correct / 500.0;
  };
  EXPECT_GT(nn_accuracy(Values<int64_t>(te[1])), 0.6);
}

TEST(SyntheticTest, WithoutLabelFeedOnlyFeaturesAreFilled) {
  std::unique_ptr<Dataset> ds = MustOpen("synthetic:size=10", {{"x", F32, {-1, 4}}});
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->label_feed(), -1);
  std::vector<Tensor> out = MustBatch(*ds, {9, 0});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_THAT(out[0].shape(), ::testing::ElementsAre(2, 4));
  std::vector<Tensor> bad;
  std::vector<int64_t> past_end = {10};
  EXPECT_EQ(ds->GetBatch(past_end, &bad).code(), absl::StatusCode::kOutOfRange);
}

// ---------------------------------------------------------------------------
// Spec and feed errors.

TEST(DatasetSpecTest, BadSpecsNameTheKey) {
  struct Case {
    std::string spec;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"synthetic:classes=1", "key 'classes' is 1, expected 2.."},
           {"synthetic:size=0", "key 'size' is 0, expected 1.."},
           {"synthetic:classes=abc", "key 'classes' needs an integer, got 'abc'"},
           {"synthetic:classes=", "key 'classes' needs a value"},
           {"synthetic:size", "key 'size' needs a value"},
           {"synthetic:foo=3", "unknown key 'foo' for synthetic"},
           {"synthetic:test=1", "key 'test' takes no value"},
           {"synthetic:train,test", "both 'train' and 'test'"},
           {"synthetic:classes=3,classes=4", "repeats key 'classes'"},
           {"synthetic:classes=3,", "empty item"},
           {"synthetic:=3", "without a key"},
           {"fashion_mnist:path=", "key 'path' needs a value"},
           {"fashion_mnist:classes=3", "unknown key 'classes' for fashion_mnist"},
           {"imagenet", "unknown dataset 'imagenet'"},
           {"", "names no dataset"},
           {":test", "names no dataset"},
       }) {
    absl::Status s = OpenError(c.spec);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.spec;
    EXPECT_THAT(s.message(), HasSubstr(c.expected)) << c.spec;
    EXPECT_THAT(s.message(), HasSubstr(absl::StrCat("\"", c.spec, "\""))) << c.spec;
  }
}

TEST(DatasetSpecTest, BadFeedsAreErrorsNamingTheFeed) {
  struct Case {
    std::vector<FeedSpec> feeds;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {{}, "no FEED vars"},
           {{{"x", F32, {16, 4}}}, "feed 'x' has shape [16, 4], expected the batch dim -1 first"},
           {{{"x", F32, {}}}, "feed 'x' has shape []"},
           {{{"x", F32, {-1, 0}}}, "feed 'x' has shape [-1, 0], expected positive dims"},
           {{{"x", F32, {-1, -1}}}, "expected positive dims"},
           {{{"x", F32, {-1, 1 << 20, 1 << 20}}}, "elements per sample"},
           {{{"x", F32, {-1, 4}}, {"m", I32, {-1}}}, "feed 'm' is I32[-1]"},
           {{{"x", F32, {-1, 4}}, {"ids", I64, {-1, 4, 2}}}, "feed 'ids' is I64[-1, 4, 2]"},
           {{{"x", F32, {-1, 4}}, {"y1", I64, {-1}}, {"y2", I64, {-1}}}, "'y1' and 'y2' are both I64[-1]"},
           {{{"y", I64, {-1}}}, "at least one floating (F32/F64) feature feed or I64[-1, T] token feed"},
           {{{"t", I64, {-1, 4}}, {"y", I64, {-1}}}, "labels for feed 'y' come from a teacher over floating"},
           {{{"a", I64, {-1, 4}}, {"b", I64, {-1, 4}}, {"c", I64, {-1, 4}}}, "'a', 'b' and 'c' are all I64[-1, T]"},
           {{{"a", I64, {-1, 4}}, {"b", I64, {-1, 5}}}, "token feeds 'a' [-1, 4] and 'b' [-1, 5] differ in length"},
           {{{"a", I64, {-1, 4}}, {"b", I64, {-1, 4}}, {"y", I64, {-1}}}, "feed 'y' is an I64[-1] label feed, and 'b'"},
       }) {
    absl::Status s = OpenError("synthetic", c.feeds);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.expected;
    EXPECT_THAT(s.message(), HasSubstr(c.expected));
  }
}

// ---------------------------------------------------------------------------
// Labels against the program's classes.

Var* AddVar(Program& p, const std::string& name, DataType dtype, std::vector<int64_t> shape) {
  Var* v = p.add_var();
  v->set_name(name);
  v->set_dtype(dtype);
  for (int64_t d : shape) v->add_shape(d);
  return v;
}

Op* AddOp(Program& p, const std::string& type, std::vector<std::string> inputs, int64_t uid) {
  Op* op = p.add_op();
  op->set_type(type);
  for (const std::string& in : inputs) op->add_input(in);
  op->set_uid(uid);
  return op;
}

// logits [-1, 5] feed a loss; top [-1, 3] an accuracy; ids an embedding-like op reading the label first.
Program LabelProgram() {
  Program p;
  AddVar(p, "y", I64, {-1});
  AddVar(p, "logits", F32, {-1, 5});
  AddVar(p, "top", F64, {-1, 3});
  AddVar(p, "table", F32, {2, 4});
  AddOp(p, "embedding", {"y", "table"}, 0);
  AddOp(p, "softmax_cross_entropy", {"logits", "y"}, 4);
  AddOp(p, "accuracy", {"top", "y"}, 7)->set_name("top3");
  AddOp(p, "softmax_cross_entropy_grad", {"top", "y"}, 7);
  return p;
}

TEST(LabelCheckTest, FindsTheConsumerWithTheFewestClasses) {
  LabelConsumer c = FindLabelConsumer(LabelProgram(), "y");
  EXPECT_EQ(c.classes, 3);
  EXPECT_EQ(c.what, "op #7 'accuracy' (top3) has 3 classes (logits 'top' [-1, 3])");
  EXPECT_EQ(FindLabelConsumer(LabelProgram(), "other").classes, 0);
}

TEST(LabelCheckTest, SyntheticClassesMustFitTheConsumer) {
  const std::vector<FeedSpec> feeds = {{"x", F32, {-1, 4}}, {"y", I64, {-1}}};
  const LabelConsumer consumer = FindLabelConsumer(LabelProgram(), "y");
  EXPECT_TRUE(CheckLabelsFit(*MustOpen("synthetic:classes=3", feeds), consumer, "--data s").ok());
  EXPECT_TRUE(CheckLabelsFit(*MustOpen("synthetic:classes=2", feeds), consumer, "--data s").ok());
  absl::Status s = CheckLabelsFit(*MustOpen("synthetic:classes=4", feeds), consumer, "--data synthetic:classes=4");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "--data synthetic:classes=4: labels run to 3, but op #7 'accuracy' (top3) has 3 classes (logits 'top' "
            "[-1, 3]), so label 3 is outside the classes [0, 3) (classes=3 fits)");
  s = CheckLabelsFit(*MustOpen("synthetic", feeds), consumer, "--data synthetic");
  EXPECT_THAT(s.message(), HasSubstr("label 9 of the default 10 synthetic classes is outside the classes [0, 3)"));
  // Nothing to check: no label feed, or no op reading it.
  EXPECT_TRUE(CheckLabelsFit(*MustOpen("synthetic", {{"x", F32, {-1, 4}}}), consumer, "--data synthetic").ok());
  EXPECT_TRUE(CheckLabelsFit(*MustOpen("synthetic", feeds), LabelConsumer(), "--data synthetic").ok());
}

TEST(LabelCheckTest, IdxLabelsNameTheFirstSampleWithTheLargest) {
  std::string dir = MakeTinyIdxDir("tiny_label_check", false, {1, 4, 4});
  const std::vector<FeedSpec> feeds = {{"x", F32, {-1, 4}}, {"y", I64, {-1}}};
  std::unique_ptr<Dataset> ds = MustOpen(absl::StrCat("mnist:path=", dir), feeds);
  ASSERT_NE(ds, nullptr);
  absl::Status s = CheckLabelsFit(*ds, FindLabelConsumer(LabelProgram(), "y"), "--data mnist");
  EXPECT_EQ(s.message(),
            "--data mnist: labels run to 4, but op #7 'accuracy' (top3) has 3 classes (logits 'top' [-1, 3]), so "
            "label 4 at index 1 is outside the classes [0, 3)");
  Program five = LabelProgram();
  five.mutable_op()->DeleteSubrange(2, 2);  // only the 5-class loss is left
  EXPECT_TRUE(CheckLabelsFit(*ds, FindLabelConsumer(five, "y"), "--data mnist").ok());
}

// ---------------------------------------------------------------------------
// Token files: little-endian uint16 ids in windows of T + 1.

const std::vector<FeedSpec> kTokenFeeds = {{"tokens", I64, {-1, 3}}, {"targets", I64, {-1, 3}}};

// Writes `ids` as little-endian uint16 to a test file and returns its path.
std::string WriteTokenFile(const std::string& name, const std::vector<uint16_t>& ids) {
  std::string bytes;
  for (uint16_t id : ids) {
    bytes += static_cast<char>(id & 0xff);
    bytes += static_cast<char>(id >> 8);
  }
  const std::string path = absl::StrCat(::testing::TempDir(), "/", name);
  WriteFile(path, bytes, false);
  return path;
}

// Token p of the hand-made files: both bytes vary, so a byte-order slip shows.
uint16_t TokenAt(int64_t p) { return static_cast<uint16_t>(p * 257 + 3); }

std::vector<int64_t> TokensFrom(int64_t first, int64_t n) {
  std::vector<int64_t> v;
  for (int64_t p = first; p < first + n; ++p) v.push_back(TokenAt(p));
  return v;
}

TEST(TokenDatasetTest, WindowsAreExactAndTargetsShiftedByOne) {
  std::vector<uint16_t> ids;
  for (int p = 0; p < 14; ++p) ids.push_back(TokenAt(p));  // 3 windows of 4, then 2 tokens dropped
  std::unique_ptr<Dataset> ds = MustOpen(absl::StrCat("tokens:path=", WriteTokenFile("t14.u16", ids)), kTokenFeeds);
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->label_feed(), 1);  // the targets
  std::vector<Tensor> batch = MustBatch(*ds, {2, 0, 1});
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_THAT(batch[0].shape(), ::testing::ElementsAre(3, 3));
  EXPECT_THAT(batch[1].shape(), ::testing::ElementsAre(3, 3));
  std::vector<int64_t> tokens = TokensFrom(8, 3), targets = TokensFrom(9, 3);
  for (int64_t window : {0, 4}) {
    for (int64_t t : TokensFrom(window, 3)) tokens.push_back(t);
    for (int64_t t : TokensFrom(window + 1, 3)) targets.push_back(t);
  }
  EXPECT_EQ(Values<int64_t>(batch[0]), tokens);
  EXPECT_EQ(Values<int64_t>(batch[1]), targets);
  std::vector<Tensor> bad;
  std::vector<int64_t> past_end = {3};
  EXPECT_EQ(ds->GetBatch(past_end, &bad).code(), absl::StatusCode::kOutOfRange);
}

TEST(TokenDatasetTest, SizeCountsWholeWindowsOnly) {
  for (const auto& [count, windows] :
       std::vector<std::pair<int, int64_t>>{{4, 1}, {7, 1}, {8, 2}, {9, 2}, {400, 100}}) {
    std::vector<uint16_t> ids(count, 7);
    std::unique_ptr<Dataset> ds =
        MustOpen(absl::StrCat("tokens:path=", WriteTokenFile(absl::StrCat("t", count, ".u16"), ids)), kTokenFeeds);
    ASSERT_NE(ds, nullptr);
    EXPECT_EQ(ds->size(), windows) << count << " tokens";
  }
}

// size=N keeps the first N windows (an evaluation's subset), their tokens
// alone checked: an id past the vocab after them is not read.
TEST(TokenDatasetTest, SizeKeepsTheFirstWindows) {
  // kTokenFeeds' windows are 4 tokens; the third window holds 900.
  const std::string path = WriteTokenFile("sized.u16", {1, 2, 3, 4, 5, 6, 7, 8, 900, 10, 11, 12});
  std::unique_ptr<Dataset> all = MustOpen(absl::StrCat("tokens:path=", path), kTokenFeeds);
  std::unique_ptr<Dataset> two = MustOpen(absl::StrCat("tokens:path=", path, ",size=2"), kTokenFeeds);
  ASSERT_NE(all, nullptr);
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(all->size(), 3);
  EXPECT_EQ(two->size(), 2);
  EXPECT_EQ(all->largest_label().label, 900);
  EXPECT_EQ(two->largest_label().label, 8);
  EXPECT_NE(all->identity(), two->identity());
  EXPECT_EQ(Values<int64_t>(MustBatch(*two, {1})[0]), Values<int64_t>(MustBatch(*all, {1})[0]));
  EXPECT_THAT(std::string(OpenError(absl::StrCat("tokens:path=", path, ",size=4"), kTokenFeeds).message()),
              HasSubstr("size=4 is more than the 3 windows of 4 tokens in " + path));
  EXPECT_THAT(std::string(OpenError(absl::StrCat("tokens:path=", path, ",size=0"), kTokenFeeds).message()),
              HasSubstr("key 'size' is 0, expected 1.."));
}

TEST(TokenDatasetTest, OneTokenFeedGetsTheWindowsFirstTokensAndNoLabels) {
  std::vector<uint16_t> ids;
  for (int p = 0; p < 8; ++p) ids.push_back(TokenAt(p));
  std::unique_ptr<Dataset> ds =
      MustOpen(absl::StrCat("tokens:path=", WriteTokenFile("t8.u16", ids)), {{"ids", I64, {-1, 3}}});
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->label_feed(), -1);
  std::vector<Tensor> batch = MustBatch(*ds, {1});
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(Values<int64_t>(batch[0]), TokensFrom(4, 3));
}

TEST(TokenDatasetTest, EpochOrderShufflesWindowsBySeedAndEpoch) {
  std::vector<uint16_t> ids;
  for (int p = 0; p < 4 * 50; ++p) ids.push_back(TokenAt(p));
  std::unique_ptr<Dataset> ds = MustOpen(absl::StrCat("tokens:path=", WriteTokenFile("t200.u16", ids)), kTokenFeeds);
  ASSERT_NE(ds, nullptr);
  // The trainer draws each epoch's order over size() windows.
  const std::vector<int64_t> epoch0 = EpochOrder(ds->size(), 5, 0), epoch1 = EpochOrder(ds->size(), 5, 1);
  EXPECT_EQ(epoch0, EpochOrder(ds->size(), 5, 0));
  EXPECT_NE(epoch0, epoch1);
  std::vector<int64_t> sorted = epoch1;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> all(50);
  std::iota(all.begin(), all.end(), 0);
  EXPECT_EQ(sorted, all);
  // Batch position b holds window epoch1[b], whatever the order.
  std::vector<Tensor> batch = MustBatch(*ds, std::vector<int64_t>(epoch1.begin(), epoch1.begin() + 8));
  std::vector<int64_t> tokens = Values<int64_t>(batch[0]);
  for (int b = 0; b < 8; ++b) {
    EXPECT_EQ(std::vector<int64_t>(tokens.begin() + 3 * b, tokens.begin() + 3 * b + 3), TokensFrom(4 * epoch1[b], 3));
  }
}

TEST(TokenDatasetTest, IdentityNamesCountsAndContentNotThePath) {
  std::vector<uint16_t> ids(12, 9);
  std::unique_ptr<Dataset> a = MustOpen(absl::StrCat("tokens:path=", WriteTokenFile("ida.u16", ids)), kTokenFeeds);
  std::unique_ptr<Dataset> b = MustOpen(absl::StrCat("tokens:path=", WriteTokenFile("idb.u16", ids)), kTokenFeeds);
  ids[5] = 10;
  std::unique_ptr<Dataset> c = MustOpen(absl::StrCat("tokens:path=", WriteTokenFile("idc.u16", ids)), kTokenFeeds);
  ASSERT_TRUE(a && b && c);
  EXPECT_EQ(a->identity(), b->identity());
  EXPECT_NE(a->identity(), c->identity());
  EXPECT_THAT(a->identity(), HasSubstr("tokens 12 tokens 3 windows of 4"));
  EXPECT_THAT(a->identity(), ::testing::Not(HasSubstr("ida.u16")));
}

TEST(TokenDatasetTest, BadFilesAreOneErrorNamingTheFile) {
  const std::string odd = absl::StrCat(::testing::TempDir(), "/odd.u16");
  WriteFile(odd, "abc", false);
  const std::string short_file = WriteTokenFile("short.u16", {1, 2, 3});
  const std::string large = WriteTokenFile("large.u16", {1, 2, 300, 4, 5, 300, 7, 8});
  const std::string missing = absl::StrCat(::testing::TempDir(), "/no_such.u16");
  struct Case {
    std::string spec;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {absl::StrCat("tokens:path=", missing), absl::StrCat(missing, ": no such file")},
           {absl::StrCat("tokens:path=", odd), absl::StrCat(odd, ": 3 bytes, an odd count")},
           {absl::StrCat("tokens:path=", short_file),
            absl::StrCat(short_file, ": 3 tokens, fewer than one window of 4 (token feed 'tokens' [-1, 3]")},
           {absl::StrCat("tokens:path=", ::testing::TempDir()), absl::StrCat(::testing::TempDir(), ": is a folder")},
           {absl::StrCat("tokens:path=", large, ",vocab=300"),
            absl::StrCat(large, ": token 300 at position 2 is not below vocab=300")},
           {"tokens", "data spec \"tokens\" needs path=FILE"},
           {"tokens:path=", "key 'path' needs a value"},
           {absl::StrCat("tokens:path=", large, ",vocab=0"), "key 'vocab' is 0, expected 1..65536"},
           {absl::StrCat("tokens:path=", large, ",classes=3"),
            "unknown key 'classes' for tokens (accepted: path, vocab, size)"},
       }) {
    absl::Status s = OpenError(c.spec, kTokenFeeds);
    EXPECT_FALSE(s.ok()) << c.spec;
    EXPECT_THAT(s.message(), HasSubstr(c.expected)) << c.spec;
  }
  EXPECT_NE(MustOpen(absl::StrCat("tokens:path=", large, ",vocab=301"), kTokenFeeds), nullptr);
}

// Another job rewriting the corpus in place while a run reads it: the
// windows past the new end are an error naming the file (a mapping of it died
// of SIGBUS), the windows still there read as before.
TEST(TokenDatasetTest, AFileCutShortWhileInUseIsAnErrorNamingIt) {
  std::vector<uint16_t> ids;
  for (int p = 0; p < 16; ++p) ids.push_back(TokenAt(p));
  const std::string path = WriteTokenFile("shrinks.u16", ids);
  std::unique_ptr<Dataset> ds = MustOpen(absl::StrCat("tokens:path=", path), kTokenFeeds);
  ASSERT_NE(ds, nullptr);
  ASSERT_EQ(ds->size(), 4);
  ASSERT_EQ(truncate(path.c_str(), 10), 0);  // 5 tokens: window 0 and one token of window 1
  std::vector<Tensor> batch;
  std::vector<int64_t> gone = {0, 3};
  absl::Status s = ds->GetBatch(gone, &batch);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(s.message(), HasSubstr(absl::StrCat(path, ": the file shrank while in use (32 bytes when opened, 10 now); "
                                                  "tokens 12..15 reach past its end")));
  EXPECT_EQ(Values<int64_t>(MustBatch(*ds, {0})[0]), TokensFrom(0, 3));
}

TEST(TokenDatasetTest, FeedsOtherThanTokensAreAnError) {
  const std::string path = WriteTokenFile("feeds.u16", {1, 2, 3, 4, 5, 6, 7, 8});
  const std::string spec = absl::StrCat("tokens:path=", path);
  EXPECT_THAT(OpenError(spec, kMlpFeeds).message(),
              HasSubstr("tokens fills one I64[-1, T] token feed and optionally a second one of targets, nothing "
                        "else; the program's feeds are 'image' F32[-1, 784], 'label' I64[-1]"));
  EXPECT_THAT(OpenError(spec, {{"t", I64, {-1, 3}}, {"x", F32, {-1, 2}}}).message(), HasSubstr("nothing else"));
  EXPECT_THAT(OpenError("mnist:path=/nowhere", kTokenFeeds).message(),
              HasSubstr("mnist has no token ids for feed 'tokens' (use --data tokens:path=FILE)"));
}

// tokens [-1, 3] -> embedding 'wte' [V, 4] -> matmul 'head' -> logits [-1, 3, C] -> loss on targets.
Program TokenProgram(int64_t table_rows, int64_t classes) {
  Program p;
  AddVar(p, "tokens", I64, {-1, 3});
  AddVar(p, "targets", I64, {-1, 3});
  AddVar(p, "wte", F32, {table_rows, 4});
  AddVar(p, "x", F32, {-1, 3, 4});
  AddVar(p, "head", F32, {4, classes});
  AddVar(p, "logits", F32, {-1, 3, classes});
  AddOp(p, "embedding", {"tokens", "wte"}, 0);
  AddOp(p, "matmul", {"x", "head"}, 1);
  AddOp(p, "softmax_cross_entropy", {"logits", "targets"}, 2);
  return p;
}

TEST(TokenDatasetTest, TokensMustFitTheEmbeddingAndTheLoss) {
  EXPECT_EQ(TokenFeedName(kTokenFeeds), "tokens");
  EXPECT_EQ(LabelFeedName(kTokenFeeds), "targets");
  EXPECT_EQ(TokenFeedName(kMlpFeeds), "");
  const LabelConsumer table = FindTokenConsumer(TokenProgram(200, 300), "tokens");
  EXPECT_EQ(table.classes, 200);
  EXPECT_EQ(table.what, "op #0 'embedding' has a table of 200 rows ('wte' [200, 4])");
  EXPECT_EQ(FindLabelConsumer(TokenProgram(200, 300), "targets").classes, 300);
  // A lone token feed that is the loss's targets is bounded by the loss's classes.
  EXPECT_EQ(FindTokenConsumer(TokenProgram(200, 300), "targets").classes, 300);
  EXPECT_EQ(FindTokenConsumer(TokenProgram(200, 30), "targets").what,
            "op #2 'softmax_cross_entropy' has 30 classes (logits 'logits' [-1, 3, 30])");

  const std::string path = WriteTokenFile("fit.u16", {1, 2, 250, 4, 5, 250, 7, 8});
  std::unique_ptr<Dataset> ds = MustOpen(absl::StrCat("tokens:path=", path), kTokenFeeds);
  ASSERT_NE(ds, nullptr);
  EXPECT_TRUE(CheckLabelsFit(*ds, FindTokenConsumer(TokenProgram(251, 251), "tokens"), "--data t").ok());
  absl::Status s = CheckLabelsFit(*ds, table, "--data t");
  EXPECT_EQ(s.message(),
            absl::StrCat("--data t: tokens run to 250, but op #0 'embedding' has a table of 200 rows ('wte' [200, 4]), "
                         "so token 250 at position 2 of ",
                         path, " is outside the vocab [0, 200)"));
}

TEST(SyntheticTest, TokenFeedsGetShiftedWindowsBelowTheVocab) {
  // The vocab defaults to the program's (the caller's hint), else 256; vocab= overrides it.
  for (const auto& [spec, hint, vocab] : std::vector<std::tuple<std::string, int64_t, int64_t>>{
           {"synthetic", 0, 256}, {"synthetic", 50, 50}, {"synthetic:vocab=7", 50, 7}}) {
    absl::StatusOr<std::unique_ptr<Dataset>> ds = OpenDataset(spec, kTokenFeeds, 3, hint);
    ASSERT_TRUE(ds.ok()) << ds.status();
    EXPECT_EQ((*ds)->label_feed(), 1);
    EXPECT_EQ((*ds)->largest_label().label, vocab - 1) << spec;
    std::vector<Tensor> batch = MustBatch(**ds, {5, 900});
    std::vector<int64_t> tokens = Values<int64_t>(batch[0]), targets = Values<int64_t>(batch[1]);
    ASSERT_EQ(tokens.size(), 6u);
    for (int b = 0; b < 2; ++b) {
      EXPECT_EQ(tokens[3 * b + 1], targets[3 * b]);
      EXPECT_EQ(tokens[3 * b + 2], targets[3 * b + 1]);
    }
    for (int64_t t : tokens) EXPECT_TRUE(t >= 0 && t < vocab) << t;
    for (int64_t t : targets) EXPECT_TRUE(t >= 0 && t < vocab) << t;
    // A sample is a function of (seed, index), not of its batch.
    std::vector<Tensor> again = MustBatch(**ds, {900});
    EXPECT_EQ(Values<int64_t>(again[0]), std::vector<int64_t>(tokens.begin() + 3, tokens.end()));
  }
  std::unique_ptr<Dataset> a = MustOpen("synthetic", kTokenFeeds, 1), b = MustOpen("synthetic", kTokenFeeds, 2);
  EXPECT_NE(Values<int64_t>(MustBatch(*a, {0, 1, 2})[0]), Values<int64_t>(MustBatch(*b, {0, 1, 2})[0]));
  // Over many draws every id of a small vocab comes up.
  std::unique_ptr<Dataset> small = MustOpen("synthetic:vocab=5", kTokenFeeds);
  std::vector<int64_t> indices(100);
  std::iota(indices.begin(), indices.end(), 0);
  std::vector<int64_t> seen = Values<int64_t>(MustBatch(*small, indices)[0]);
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_THAT(seen, ::testing::ElementsAre(0, 1, 2, 3, 4));
}

TEST(SyntheticTest, TokensBesideFeaturesAndALabel) {
  std::unique_ptr<Dataset> ds =
      MustOpen("synthetic:classes=3,vocab=9,size=20", {{"x", F32, {-1, 4}}, {"ids", I64, {-1, 5}}, {"y", I64, {-1}}});
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->label_feed(), 2);
  std::vector<Tensor> batch = MustBatch(*ds, {0, 19});
  ASSERT_EQ(batch.size(), 3u);
  EXPECT_THAT(batch[1].shape(), ::testing::ElementsAre(2, 5));
  for (int64_t t : Values<int64_t>(batch[1])) EXPECT_TRUE(t >= 0 && t < 9) << t;
  for (int64_t y : Values<int64_t>(batch[2])) EXPECT_TRUE(y >= 0 && y < 3) << y;
}

}  // namespace
}  // namespace strata
