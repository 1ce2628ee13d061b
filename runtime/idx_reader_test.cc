#include "runtime/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata {
namespace {

using ::testing::HasSubstr;

const char kFashionDir[] = "/usr/share/datasets/fashion-mnist";

std::string TempPath(const std::string& name) { return absl::StrCat(::testing::TempDir(), "/idx_", name); }

// An IDX header for unsigned bytes with the given dims, big-endian.
std::string IdxHeader(const std::vector<uint32_t>& dims, uint8_t type = 0x08) {
  std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    s += static_cast<char>(d >> 24);
    s += static_cast<char>(d >> 16);
    s += static_cast<char>(d >> 8);
    s += static_cast<char>(d);
  }
  return s;
}

std::string WritePlain(const std::string& name, const std::string& bytes) {
  std::string path = TempPath(name);
  FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
  return path;
}

std::string WriteGzip(const std::string& name, const std::string& bytes) {
  std::string path = TempPath(name);
  gzFile f = gzopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr);
  gzwrite(f, bytes.data(), bytes.size());
  gzclose(f);
  return path;
}

std::string ReadAll(const std::string& path) {
  std::string bytes;
  FILE* f = std::fopen(path.c_str(), "rb");
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) bytes.append(buf, n);
  std::fclose(f);
  return bytes;
}

TEST(IdxReaderTest, ReadsRealFashionMnistTrainFiles) {
  absl::StatusOr<IdxImagesAndLabels> data =
      ReadIdxImagesAndLabels(absl::StrCat(kFashionDir, "/train-images-idx3-ubyte.gz"),
                             absl::StrCat(kFashionDir, "/train-labels-idx1-ubyte.gz"), 10);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 60000);
  EXPECT_EQ(data->rows, 28);
  EXPECT_EQ(data->cols, 28);
  ASSERT_EQ(data->pixels.size(), 60000u * 28 * 28);
  // The first ten training labels of Fashion-MNIST (ankle boot, T-shirt, T-shirt, dress, ...).
  EXPECT_THAT(std::vector<int>(data->labels.begin(), data->labels.begin() + 10),
              ::testing::ElementsAre(9, 0, 0, 3, 0, 2, 7, 2, 5, 5));
  // The training set holds exactly 6000 samples per class.
  std::vector<int> per_class(10, 0);
  for (uint8_t label : data->labels) ++per_class[label];
  EXPECT_THAT(per_class, ::testing::Each(6000));
  // Sum of the first image's pixels, computed with Python's gzip module.
  int64_t sum = 0;
  for (int i = 0; i < 784; ++i) sum += data->pixels[i];
  EXPECT_EQ(sum, 76247);
}

TEST(IdxReaderTest, ReadsRealFashionMnistTestFiles) {
  absl::StatusOr<IdxImagesAndLabels> data =
      ReadIdxImagesAndLabels(absl::StrCat(kFashionDir, "/t10k-images-idx3-ubyte.gz"),
                             absl::StrCat(kFashionDir, "/t10k-labels-idx1-ubyte.gz"), 10);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->count, 10000);
  EXPECT_THAT(std::vector<int>(data->labels.begin(), data->labels.begin() + 10),
              ::testing::ElementsAre(9, 2, 1, 1, 6, 1, 4, 6, 5, 7));
}

TEST(IdxReaderTest, ReadsPlainAndGzipFilesAlike) {
  std::string bytes = IdxHeader({2, 3}) + std::string("\x01\x02\x03\x04\x05\xff", 6);
  for (const std::string& path : {WritePlain("plain.idx", bytes), WriteGzip("small.idx.gz", bytes)}) {
    absl::StatusOr<IdxArray> array = ReadIdxFile(path);
    ASSERT_TRUE(array.ok()) << array.status();
    EXPECT_THAT(array->dims, ::testing::ElementsAre(2, 3));
    EXPECT_THAT(array->data, ::testing::ElementsAre(1, 2, 3, 4, 5, 255));
  }
}

TEST(IdxReaderTest, MissingFileNamesPath) {
  std::string path = TempPath("does_not_exist.gz");
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST(IdxReaderTest, DirectoryIsRejected) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(::testing::TempDir());
  EXPECT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(), HasSubstr("not a regular file"));
}

TEST(IdxReaderTest, TruncatedDataIsAnError) {
  std::string path = WritePlain("truncated.idx", IdxHeader({4, 4}) + std::string(10, 'x'));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(array.status().message(), HasSubstr(path));
  EXPECT_THAT(array.status().message(), HasSubstr("need 16 bytes, file has 10"));
}

TEST(IdxReaderTest, TruncatedHeaderIsAnError) {
  for (const std::string& bytes : {std::string("\0\0", 2), IdxHeader({4, 4}).substr(0, 7)}) {
    absl::StatusOr<IdxArray> array = ReadIdxFile(WritePlain("short_header.idx", bytes));
    EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss) << array.status();
    EXPECT_THAT(array.status().message(), HasSubstr("truncated"));
  }
}

TEST(IdxReaderTest, TruncatedGzipStreamIsAnError) {
  std::string full = WriteGzip("full.idx.gz", IdxHeader({64, 64}) + std::string(4096, '\x7f'));
  std::string bytes = ReadAll(full);
  std::string path = WritePlain("cut.idx.gz", bytes.substr(0, bytes.size() / 2));
  absl::StatusOr<IdxArray> array = ReadIdxFile(path);
  EXPECT_FALSE(array.ok());
  EXPECT_THAT(array.status().message(), HasSubstr(path));
}

TEST(IdxReaderTest, WrongMagicIsAnError) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(WritePlain("magic.idx", "GIF89a" + std::string(32, '\0')));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(), HasSubstr("not an IDX file"));
}

TEST(IdxReaderTest, NonByteElementTypeIsAnError) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(WritePlain("float.idx", IdxHeader({1}, 0x0D) + std::string(4, '\0')));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(), HasSubstr("element type 0xd"));
}

TEST(IdxReaderTest, AbsurdDimsAreAnError) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(WritePlain("huge.idx", IdxHeader({0xFFFFFFFFu, 0xFFFFFFFFu, 2})));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(), HasSubstr("absurd"));

  array = ReadIdxFile(WritePlain("rank0.idx", IdxHeader({})));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(), HasSubstr("rank 0"));
}

TEST(IdxReaderTest, HugeButTruncatedFileFailsWithoutReadingItAll) {
  // 4 GiB declared, a few bytes present: must fail as truncated, not allocate 4 GiB.
  absl::StatusOr<IdxArray> array = ReadIdxFile(WritePlain("big_decl.idx", IdxHeader({65536, 65536}) + "abc"));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kDataLoss);
}

TEST(IdxReaderTest, TrailingBytesAreAnError) {
  absl::StatusOr<IdxArray> array = ReadIdxFile(WritePlain("trailing.idx", IdxHeader({2}) + "abc"));
  EXPECT_EQ(array.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(array.status().message(), HasSubstr("trailing bytes"));
}

TEST(IdxReaderTest, ImageLabelCountMismatchIsAnError) {
  std::string images = WriteGzip("img3.gz", IdxHeader({3, 2, 2}) + std::string(12, '\0'));
  std::string labels = WriteGzip("lab2.gz", IdxHeader({2}) + std::string(2, '\1'));
  absl::StatusOr<IdxImagesAndLabels> data = ReadIdxImagesAndLabels(images, labels, 10);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("count mismatch"));
  EXPECT_THAT(data.status().message(), HasSubstr("3 images"));
  EXPECT_THAT(data.status().message(), HasSubstr("2 labels"));
}

TEST(IdxReaderTest, LabelOutOfRangeNamesFileAndIndex) {
  std::string images = WriteGzip("img4.gz", IdxHeader({4, 2, 2}) + std::string(16, '\0'));
  std::string labels = WriteGzip("lab_bad.gz", IdxHeader({4}) + std::string("\x01\x09\x0a\x02", 4));
  absl::StatusOr<IdxImagesAndLabels> data = ReadIdxImagesAndLabels(images, labels, 10);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr(labels));
  EXPECT_THAT(data.status().message(), HasSubstr("label 10 at index 2"));
}

TEST(IdxReaderTest, WrongRanksAreErrors) {
  std::string flat = WriteGzip("flat.gz", IdxHeader({4}) + std::string(4, '\0'));
  absl::StatusOr<IdxImagesAndLabels> data = ReadIdxImagesAndLabels(flat, flat, 10);
  EXPECT_THAT(data.status().message(), HasSubstr("expected 3 dims"));
  std::string images = WriteGzip("img1.gz", IdxHeader({1, 2, 2}) + std::string(4, '\0'));
  data = ReadIdxImagesAndLabels(images, images, 10);
  EXPECT_THAT(data.status().message(), HasSubstr("expected 1 dim"));
}

}  // namespace
}  // namespace strata
