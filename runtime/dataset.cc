#include "runtime/dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "runtime/idx_reader.h"
#include "runtime/philox.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";
// Per-sample elements above this are a typo in the program, not a dataset.
constexpr int64_t kMaxSampleElements = int64_t{1} << 28;
// The synthetic teacher stores hidden x features weights; bound its memory (256 MiB).
constexpr int64_t kMaxSyntheticFeatures = int64_t{1} << 20;
constexpr int64_t kMaxSyntheticClasses = 1 << 16;
// Token ids of a file are uint16; synthetic ones may run as far.
constexpr int64_t kMaxSyntheticVocab = 1 << 16;
// The sample order of an epoch is held in memory (8 bytes a sample).
constexpr int64_t kMaxSyntheticSize = int64_t{100000000};
// The most samples a file's size=N may keep (a count, not a bound on the file).
constexpr int64_t kMaxSamples = int64_t{1} << 40;
constexpr int kTeacherHidden = 64;
// Synthetic samples cost their teacher's ~features x 64 multiply-adds and as
// many normal draws each, more than a small model's step: a data set of at
// most this many bytes of samples is computed once and kept (the default 8192
// samples of 784 features take 51 MiB).
constexpr int64_t kMaxSyntheticCacheBytes = int64_t{256} << 20;
// Class-bias calibration: on when it costs at most ~2^28 multiply-adds and every
// class gets 16+ calibration samples on average.
constexpr int64_t kCalibrationSamples = 4096;
constexpr int kCalibrationIterations = 300;
constexpr int64_t kCalibrateMaxFeatures = 1024;
constexpr int64_t kCalibrateMaxClasses = 256;
// Counter word that separates held-out samples from training samples.
constexpr uint64_t kTestSampleBit = uint64_t{1} << 63;

// ---------------------------------------------------------------------------
// Spec parsing: "name[:key[=value][,key[=value]]...]".

class SpecArgs {
 public:
  static absl::StatusOr<SpecArgs> Parse(const std::string& spec) {
    SpecArgs args;
    args.spec_ = spec;
    absl::string_view text = absl::StripAsciiWhitespace(spec);
    size_t colon = text.find(':');
    args.name_ = std::string(absl::StripAsciiWhitespace(text.substr(0, colon)));
    if (args.name_.empty()) return args.Error("names no dataset (expected fashion_mnist, mnist, synthetic or tokens)");
    // "fashion_mnist,path=DIR": the items follow a ':', commas only separate them.
    if (absl::StrContains(args.name_, ',')) {
      std::string fixed(text);
      fixed[fixed.find(',')] = ':';
      return args.Error(absl::StrCat("puts a ',' after the dataset name; options follow a ':' (write \"", fixed, "\")"));
    }
    if (colon == absl::string_view::npos) return args;
    absl::string_view rest = text.substr(colon + 1);
    for (absl::string_view item : absl::StrSplit(rest, ',')) {
      item = absl::StripAsciiWhitespace(item);
      if (item.empty()) return args.Error("has an empty item (expected key or key=value between commas)");
      size_t eq = item.find('=');
      std::string key(absl::StripAsciiWhitespace(item.substr(0, eq)));
      if (key.empty()) return args.Error(absl::StrCat("has an item '", item, "' without a key"));
      std::optional<std::string> value;
      if (eq != absl::string_view::npos) value = std::string(absl::StripAsciiWhitespace(item.substr(eq + 1)));
      if (!args.items_.emplace(key, value).second) return args.Error(absl::StrCat("repeats key '", key, "'"));
    }
    return args;
  }

  const std::string& name() const { return name_; }
  bool Has(const std::string& key) const { return items_.count(key) > 0; }

  absl::StatusOr<bool> TakeFlag(const std::string& key) {
    auto it = items_.find(key);
    if (it == items_.end()) return false;
    if (it->second.has_value()) return Error(absl::StrCat("key '", key, "' takes no value, got '", *it->second, "'"));
    items_.erase(it);
    return true;
  }

  absl::StatusOr<std::optional<std::string>> TakeString(const std::string& key) {
    auto it = items_.find(key);
    if (it == items_.end()) return std::optional<std::string>();
    if (!it->second.has_value() || it->second->empty()) return Error(absl::StrCat("key '", key, "' needs a value"));
    std::optional<std::string> value = it->second;
    items_.erase(it);
    return value;
  }

  absl::StatusOr<int64_t> TakeInt(const std::string& key, int64_t default_value, int64_t min, int64_t max) {
    absl::StatusOr<std::optional<std::string>> text = TakeString(key);
    if (!text.ok()) return text.status();
    if (!text->has_value()) return default_value;
    int64_t value;
    if (!absl::SimpleAtoi(**text, &value)) {
      return Error(absl::StrCat("key '", key, "' needs an integer, got '", **text, "'"));
    }
    if (value < min || value > max) {
      return Error(absl::StrCat("key '", key, "' is ", value, ", expected ", min, "..", max));
    }
    return value;
  }

  // train/test flags; true for the held-out split.
  absl::StatusOr<bool> TakeSplit() {
    absl::StatusOr<bool> train = TakeFlag("train");
    if (!train.ok()) return train.status();
    absl::StatusOr<bool> test = TakeFlag("test");
    if (!test.ok()) return test.status();
    if (*train && *test) return Error("names both 'train' and 'test'");
    return *test;
  }

  // Any key left over is unknown.
  absl::Status Finish(const std::vector<std::string>& accepted) const {
    if (items_.empty()) return absl::OkStatus();
    return Error(absl::StrCat("has unknown key '", items_.begin()->first, "' for ", name_,
                              " (accepted: ", absl::StrJoin(accepted, ", "), ")"));
  }

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("data spec \"", spec_, "\" ", what));
  }

 private:
  std::string spec_;
  std::string name_;
  std::map<std::string, std::optional<std::string>> items_;
};

// ---------------------------------------------------------------------------
// Feeds: the floating feeds are features; I64 [-1, T] feeds hold token ids,
// the first declared the input tokens and a second (same T) the targets; the
// label feed is the one I64 [-1] feed, else the targets.

struct FeedRoles {
  int label = -1;
  std::vector<int> features;                // indices into feeds
  std::vector<int> tokens;                  // I64 [-1, T] feeds, in declaration order (at most 2)
  std::vector<int64_t> elements_per_sample;  // per feed
};

absl::StatusOr<FeedRoles> ClassifyFeeds(const std::vector<FeedSpec>& feeds) {
  if (feeds.empty()) return absl::InvalidArgumentError("the program has no FEED vars for the dataset to fill");
  FeedRoles roles;
  for (int i = 0; i < static_cast<int>(feeds.size()); ++i) {
    const FeedSpec& feed = feeds[i];
    std::string type = absl::StrCat(DataTypeName(feed.dtype), ShapeString(feed.shape));
    if (feed.shape.empty() || feed.shape[0] != -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("feed '", feed.name, "' has shape ", ShapeString(feed.shape),
                       ", expected the batch dim -1 first"));
    }
    int64_t elements = 1;
    for (size_t d = 1; d < feed.shape.size(); ++d) {
      if (feed.shape[d] < 1 || feed.shape[d] > kMaxSampleElements ||
          elements * feed.shape[d] > kMaxSampleElements) {
        return absl::InvalidArgumentError(
            absl::StrCat("feed '", feed.name, "' has shape ", ShapeString(feed.shape),
                         ", expected positive dims after the batch dim and at most ", kMaxSampleElements,
                         " elements per sample"));
      }
      elements *= feed.shape[d];
    }
    roles.elements_per_sample.push_back(elements);
    if (feed.dtype == I64 && feed.shape.size() == 1) {
      if (roles.label >= 0) {
        return absl::InvalidArgumentError(absl::StrCat("feeds '", feeds[roles.label].name, "' and '", feed.name,
                                                       "' are both I64[-1]; a dataset fills exactly one label feed"));
      }
      roles.label = i;
    } else if (feed.dtype == I64 && feed.shape.size() == 2) {
      if (roles.tokens.size() == 2) {
        return absl::InvalidArgumentError(absl::StrCat(
            "feeds '", feeds[roles.tokens[0]].name, "', '", feeds[roles.tokens[1]].name, "' and '", feed.name,
            "' are all I64[-1, T]; a dataset fills at most two token feeds (tokens, then "
            "targets)"));
      }
      if (!roles.tokens.empty() && feeds[roles.tokens[0]].shape != feed.shape) {
        return absl::InvalidArgumentError(
            absl::StrCat("token feeds '", feeds[roles.tokens[0]].name, "' ", ShapeString(feeds[roles.tokens[0]].shape),
                         " and '", feed.name, "' ", ShapeString(feed.shape),
                         " differ in length; the targets are the tokens shifted by one, of the same length"));
      }
      roles.tokens.push_back(i);
    } else if (IsFloating(feed.dtype)) {
      roles.features.push_back(i);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("feed '", feed.name, "' is ", type,
                       "; a dataset fills floating (F32/F64) feature feeds, one I64[-1] label feed and up to two "
                       "I64[-1, T] token feeds (tokens, then targets)"));
    }
  }
  if (roles.tokens.size() == 2) {
    if (roles.label >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feed '", feeds[roles.label].name, "' is an I64[-1] label feed, and '", feeds[roles.tokens[1]].name,
          "' the targets of token feed '", feeds[roles.tokens[0]].name, "'; a dataset fills one of the two"));
    }
    roles.label = roles.tokens[1];
  }
  return roles;
}

absl::Status CheckIndices(absl::Span<const int64_t> indices, int64_t size) {
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= size) {
      return absl::OutOfRangeError(
          absl::StrCat("sample index ", indices[i], " (batch position ", i, ") is out of range [0, ", size, ")"));
    }
  }
  return absl::OkStatus();
}

// Allocates one tensor per feed with the batch dim set to n.
absl::Status AllocateBatch(const std::vector<FeedSpec>& feeds, int64_t n, Allocator* allocator, std::vector<Tensor>* out) {
  out->clear();
  out->reserve(feeds.size());
  for (const FeedSpec& feed : feeds) {
    Shape shape(feed.shape.begin(), feed.shape.end());
    shape[0] = n;
    Tensor t = Tensor::Empty(feed.dtype, shape, allocator);
    if (!t.defined()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate ", DataTypeName(feed.dtype), ShapeString(shape), " for feed '", feed.name, "'"));
    }
    out->push_back(std::move(t));
  }
  return absl::OkStatus();
}

// Makes a relative user path relative to where `bazel run` was invoked.
std::string ResolveUserPath(const std::string& path) {
  const char* cwd = std::getenv("BUILD_WORKING_DIRECTORY");
  if (path.empty() || path[0] == '/' || cwd == nullptr || *cwd == '\0') return path;
  return absl::StrCat(cwd, "/", path);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

// ---------------------------------------------------------------------------
// IDX image datasets (Fashion-MNIST, MNIST).

class IdxDataset : public Dataset {
 public:
  IdxDataset(std::vector<FeedSpec> feeds, int label_feed, int image_feed, IdxImagesAndLabels data,
             int64_t num_classes, std::string name)
      : Dataset(std::move(feeds), label_feed),
        image_feed_(image_feed),
        data_(std::move(data)),
        num_classes_(num_classes) {
    // Every label and the first 64 KiB of pixels: cheap, and it tells copies
    // of different files apart.
    uint64_t head = Fnv1a64(std::string_view(reinterpret_cast<const char*>(data_.labels.data()), data_.labels.size()));
    head = MixKey(head, Fnv1a64(std::string_view(reinterpret_cast<const char*>(data_.pixels.data()),
                                                  std::min<size_t>(data_.pixels.size(), 65536))));
    identity_ = absl::StrFormat("%s %d samples %dx%d head %016x", name, data_.count, data_.rows, data_.cols, head);
    // The first sample with the largest label, for the error that names it.
    for (int64_t i = 0; i < static_cast<int64_t>(data_.labels.size()); ++i) {
      if (data_.labels[i] > largest_label_) {
        largest_label_ = data_.labels[i];
        largest_index_ = i;
      }
    }
  }

  int64_t size() const override { return data_.count; }
  std::string identity() const override { return identity_; }
  int64_t num_classes() const override { return num_classes_; }
  LargestLabel largest_label() const override {
    if (largest_index_ < 0) return {};
    return {largest_label_, absl::StrCat("label ", largest_label_, " at index ", largest_index_), ""};
  }

  absl::Status GetBatch(absl::Span<const int64_t> indices, std::vector<Tensor>* out) const override {
    if (absl::Status s = CheckIndices(indices, size()); !s.ok()) return s;
    if (absl::Status s = AllocateBatch(feeds(), indices.size(), allocator(), out); !s.ok()) return s;
    Tensor& images = (*out)[image_feed_];
    if (images.dtype() == F32) {
      FillImages(indices, images.data<float>());
    } else {
      FillImages(indices, images.data<double>());
    }
    if (label_feed() >= 0) {
      int64_t* labels = (*out)[label_feed()].data<int64_t>();
      for (size_t i = 0; i < indices.size(); ++i) labels[i] = data_.labels[indices[i]];
    }
    return absl::OkStatus();
  }

 private:
  // images: [B, rows*cols]. Samples split over threads, 64 at least per chunk.
  template <typename T>
  void FillImages(absl::Span<const int64_t> indices, T* images) const {
    const int64_t pixels = data_.rows * data_.cols;
    ParallelFor(indices.size(), 64, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const uint8_t* src = data_.pixels.data() + indices[b] * pixels;
        T* dst = images + b * pixels;
        for (int64_t p = 0; p < pixels; ++p) dst[p] = static_cast<T>(src[p] / 255.0);
      }
    });
  }

  int image_feed_;
  std::string identity_;
  IdxImagesAndLabels data_;
  int64_t num_classes_;
  int64_t largest_label_ = -1;
  int64_t largest_index_ = -1;
};

absl::StatusOr<std::unique_ptr<Dataset>> OpenIdxDataset(SpecArgs& args, const std::vector<FeedSpec>& feeds,
                                                        const std::string& default_dir) {
  absl::StatusOr<bool> test = args.TakeSplit();
  if (!test.ok()) return test.status();
  absl::StatusOr<std::optional<std::string>> path = args.TakeString("path");
  if (!path.ok()) return path.status();
  absl::StatusOr<int64_t> size = args.TakeInt("size", 0, 1, kMaxSamples);
  if (!size.ok()) return size.status();
  if (absl::Status s = args.Finish({"train", "test", "path", "size"}); !s.ok()) return s;
  std::string dir = path->has_value() ? ResolveUserPath(**path) : default_dir;
  if (dir.empty()) return args.Error(absl::StrCat("needs path=DIR: there is no default location for ", args.name()));

  absl::StatusOr<FeedRoles> roles = ClassifyFeeds(feeds);
  if (!roles.ok()) return roles.status();
  if (!roles->tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(args.name(), " has no token ids for feed '",
                                                   feeds[roles->tokens[0]].name, "' (use --data tokens:path=FILE)"));
  }
  if (roles->features.size() != 1) {
    std::vector<std::string> names;
    for (int i : roles->features) names.push_back(feeds[i].name);
    return absl::InvalidArgumentError(absl::StrCat(args.name(), " fills exactly one floating image feed; the program has ",
                                                   names.size(), " (", absl::StrJoin(names, ", "), ")"));
  }

  const std::string prefix = absl::StrCat(dir, "/", *test ? "t10k" : "train");
  auto pick = [](const std::string& base) {
    std::string gz = base + ".gz";
    return !FileExists(gz) && FileExists(base) ? base : gz;
  };
  const int64_t kClasses = 10;
  absl::StatusOr<IdxImagesAndLabels> data = ReadIdxImagesAndLabels(
      pick(prefix + "-images-idx3-ubyte"), pick(prefix + "-labels-idx1-ubyte"), kClasses);
  if (!data.ok()) return data.status();
  if (*size > 0) {
    // The first `size` samples: an evaluation set's subset, as Megatron's --eval-iters.
    if (*size > data->count) {
      return args.Error(absl::StrCat("size=", *size, " is more than the ", data->count, " samples of ", prefix, "*"));
    }
    data->count = *size;
    data->labels.resize(static_cast<size_t>(*size));
    data->pixels.resize(static_cast<size_t>(*size * data->rows * data->cols));
  }

  const int image_feed = roles->features[0];
  const FeedSpec& feed = feeds[image_feed];
  const int64_t rows = data->rows, cols = data->cols;
  const std::vector<std::vector<int64_t>> accepted = {{-1, rows * cols}, {-1, 1, rows, cols}, {-1, rows, cols}};
  if (std::find(accepted.begin(), accepted.end(), feed.shape) == accepted.end()) {
    std::vector<std::string> shapes;
    for (const auto& s : accepted) shapes.push_back(ShapeString(s));
    return absl::InvalidArgumentError(absl::StrCat("feed '", feed.name, "' has shape ", ShapeString(feed.shape), "; ",
                                                   args.name(), " images need one of ", shapes[0], ", ", shapes[1],
                                                   " or ", shapes[2]));
  }
  return std::unique_ptr<Dataset>(
      new IdxDataset(feeds, roles->label, image_feed, *std::move(data), kClasses,
                     absl::StrCat(args.name(), " ", *test ? "test" : "train")));
}

// ---------------------------------------------------------------------------
// Token ids: a flat file of little-endian uint16, cut into non-overlapping
// windows of T + 1 tokens (a partial last window is dropped). Sample i is
// window i: the tokens feed gets its first T tokens, the targets feed its last T.

// A token file read with pread, window by window: a corpus of gigabytes
// costs no copy, and a file cut short while training (another job rewriting
// it) is an error naming it, where a mapping would die of SIGBUS.
class TokenFile {
 public:
  static absl::StatusOr<std::unique_ptr<TokenFile>> Open(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      return errno == ENOENT ? absl::NotFoundError(absl::StrCat(path, ": no such file"))
                             : absl::PermissionDeniedError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      const bool folder = S_ISDIR(st.st_mode);
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, folder ? ": is a folder" : ": is not a regular file",
                                                     ", expected a file of little-endian uint16 token ids"));
    }
    return std::unique_ptr<TokenFile>(new TokenFile(fd, path, static_cast<size_t>(st.st_size)));
  }
  ~TokenFile() { close(fd_); }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  // The size when opened.
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // Tokens [first, first + count) as int64 (little-endian whatever the host).
  // Safe from several threads at once.
  absl::Status Read(int64_t first, int64_t count, int64_t* out) const {
    std::vector<uint8_t> bytes(static_cast<size_t>(count) * 2);
    size_t done = 0;
    const off_t offset = static_cast<off_t>(first) * 2;
    while (done < bytes.size()) {
      const ssize_t n = pread(fd_, bytes.data() + done, bytes.size() - done, offset + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return absl::DataLossError(absl::StrCat(path_, ": cannot read: ", std::strerror(errno)));
      if (n == 0) {
        struct stat st;
        const int64_t now = fstat(fd_, &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
        return absl::DataLossError(absl::StrCat(
            path_, ": the file shrank while in use (", size_, " bytes when opened",
            now >= 0 ? absl::StrCat(", ", now, " now") : "", "); tokens ", first, "..", first + count - 1,
            " reach past its end: do not rewrite a corpus in place while a run reads it"));
      }
      done += static_cast<size_t>(n);
    }
    for (int64_t t = 0; t < count; ++t) out[t] = bytes[2 * t] | (bytes[2 * t + 1] << 8);
    return absl::OkStatus();
  }

 private:
  TokenFile(int fd, std::string path, size_t size) : fd_(fd), path_(std::move(path)), size_(size) {}
  int fd_;
  std::string path_;
  size_t size_;
};

// What a token file's windows hold, read once when it is opened.
struct TokenScan {
  int64_t largest_token = -1;
  int64_t largest_position = -1;
  uint64_t head_hash = 0;  // of its first 64 KiB
};

absl::StatusOr<TokenScan> ScanTokens(const TokenFile& file, int64_t tokens) {
  TokenScan scan;
  constexpr int64_t kChunk = 1 << 20;
  std::vector<int64_t> chunk;
  for (int64_t first = 0; first < tokens; first += kChunk) {
    const int64_t count = std::min(kChunk, tokens - first);
    chunk.resize(static_cast<size_t>(count));
    if (absl::Status s = file.Read(first, count, chunk.data()); !s.ok()) return s;
    for (int64_t t = 0; t < count; ++t) {
      if (chunk[t] > scan.largest_token) {
        scan.largest_token = chunk[t];
        scan.largest_position = first + t;
      }
    }
  }
  const int64_t head_tokens = std::min<int64_t>(static_cast<int64_t>(file.size() / 2), 32768);
  std::vector<int64_t> ids(static_cast<size_t>(head_tokens));
  if (absl::Status s = file.Read(0, head_tokens, ids.data()); !s.ok()) return s;
  std::string head(static_cast<size_t>(head_tokens) * 2, '\0');
  for (int64_t t = 0; t < head_tokens; ++t) {
    head[2 * t] = static_cast<char>(ids[t] & 0xff);
    head[2 * t + 1] = static_cast<char>(ids[t] >> 8);
  }
  scan.head_hash = Fnv1a64(head);
  return scan;
}

class TokenDataset : public Dataset {
 public:
  TokenDataset(std::vector<FeedSpec> feeds, FeedRoles roles, std::unique_ptr<TokenFile> file, int64_t window,
               int64_t windows, TokenScan scan)
      : Dataset(std::move(feeds), roles.label),
        roles_(std::move(roles)),
        file_(std::move(file)),
        window_(window),
        windows_(windows),
        scan_(scan),
        identity_(absl::StrFormat("tokens %d tokens %d windows of %d head %016x", file_->size() / 2, windows_, window_,
                                  scan.head_hash)) {}

  int64_t size() const override { return windows_; }
  std::string identity() const override { return identity_; }
  int64_t num_classes() const override { return scan_.largest_token + 1; }
  LargestLabel largest_label() const override {
    return {scan_.largest_token,
            absl::StrCat("token ", scan_.largest_token, " at position ", scan_.largest_position, " of ",
                         file_->path()),
            "", "tokens", "vocab"};
  }
  int64_t largest_position() const { return scan_.largest_position; }

  absl::Status GetBatch(absl::Span<const int64_t> indices, std::vector<Tensor>* out) const override {
    if (absl::Status s = CheckIndices(indices, size()); !s.ok()) return s;
    if (absl::Status s = AllocateBatch(feeds(), indices.size(), allocator(), out); !s.ok()) return s;
    const int64_t seq = window_ - 1;
    std::vector<int64_t> window(static_cast<size_t>(window_));
    for (size_t b = 0; b < indices.size(); ++b) {
      if (absl::Status s = file_->Read(indices[b] * window_, window_, window.data()); !s.ok()) return s;
      // The targets (k = 1) are the tokens shifted by one.
      for (size_t k = 0; k < roles_.tokens.size(); ++k) {
        int64_t* dst = (*out)[roles_.tokens[k]].data<int64_t>();
        std::copy_n(window.begin() + static_cast<int64_t>(k), seq, dst + b * seq);
      }
    }
    return absl::OkStatus();
  }

 private:
  FeedRoles roles_;
  std::unique_ptr<TokenFile> file_;
  int64_t window_;  // T + 1
  int64_t windows_;
  TokenScan scan_;
  std::string identity_;
};

absl::StatusOr<std::unique_ptr<Dataset>> OpenTokenDataset(SpecArgs& args, const std::vector<FeedSpec>& feeds) {
  absl::StatusOr<std::optional<std::string>> path_arg = args.TakeString("path");
  if (!path_arg.ok()) return path_arg.status();
  absl::StatusOr<int64_t> vocab = args.TakeInt("vocab", 0, 1, 65536);
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<int64_t> size = args.TakeInt("size", 0, 1, kMaxSamples);
  if (!size.ok()) return size.status();
  if (absl::Status s = args.Finish({"path", "vocab", "size"}); !s.ok()) return s;
  if (!path_arg->has_value()) return args.Error("needs path=FILE: a flat file of little-endian uint16 token ids");

  absl::StatusOr<FeedRoles> roles = ClassifyFeeds(feeds);
  if (!roles.ok()) return roles.status();
  if (roles->tokens.empty() || !roles->features.empty() ||
      roles->label != (roles->tokens.size() == 2 ? roles->tokens[1] : -1)) {
    std::vector<std::string> all;
    for (const FeedSpec& f : feeds)
      all.push_back(absl::StrCat("'", f.name, "' ", DataTypeName(f.dtype), ShapeString(f.shape)));
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens fills one I64[-1, T] token feed and optionally a second one of targets, nothing else; the program's "
        "feeds are ",
        absl::StrJoin(all, ", ")));
  }
  const FeedSpec& token_feed = feeds[roles->tokens[0]];
  const int64_t window = token_feed.shape[1] + 1;

  const std::string path = ResolveUserPath(**path_arg);
  absl::StatusOr<std::unique_ptr<TokenFile>> file = TokenFile::Open(path);
  if (!file.ok()) return file.status();
  const size_t bytes = (*file)->size();
  if (bytes % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", bytes,
                                                   " bytes, an odd count: expected little-endian uint16 token ids "
                                                   "(2 bytes each)"));
  }
  if (static_cast<int64_t>(bytes / 2) < window) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": ", bytes / 2, " tokens, fewer than one window of ", window, " (token feed '", token_feed.name, "' ",
        ShapeString(token_feed.shape), " plus the one-token shift of the targets)"));
  }
  int64_t windows = static_cast<int64_t>(bytes / 2) / window;
  if (*size > 0) {
    // The first `size` windows: an evaluation set's subset, as Megatron's --eval-iters.
    if (*size > windows) {
      return args.Error(absl::StrCat("size=", *size, " is more than the ", windows, " windows of ", window,
                                     " tokens in ", path));
    }
    windows = *size;
  }
  absl::StatusOr<TokenScan> scan = ScanTokens(**file, windows * window);
  if (!scan.ok()) return scan.status();
  auto data = std::make_unique<TokenDataset>(feeds, *std::move(roles), *std::move(file), window, windows, *scan);
  if (*vocab > 0 && data->largest_label().label >= *vocab) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": token ", data->largest_label().label, " at position ",
                                                   data->largest_position(), " is not below vocab=", *vocab));
  }
  return std::unique_ptr<Dataset>(std::move(data));
}

// ---------------------------------------------------------------------------
// Synthetic classification data from a random teacher network.

// Standard normals by Box-Muller over Philox: element j of stream `row` is a
// pure function of (key, row, j).
void FillNormals(const Philox& gen, uint64_t row, int64_t count, double* out) {
  constexpr double kTwoPi = 6.283185307179586;
  for (int64_t block = 0; block * 4 < count; ++block) {
    std::array<double, 4> u = gen.Uniform4(row, block);
    double r0 = std::sqrt(-2.0 * std::log(1.0 - u[0])), r1 = std::sqrt(-2.0 * std::log(1.0 - u[2]));
    double z[4] = {r0 * std::cos(kTwoPi * u[1]), r0 * std::sin(kTwoPi * u[1]), r1 * std::cos(kTwoPi * u[3]),
                   r1 * std::sin(kTwoPi * u[3])};
    for (int k = 0; k < 4 && block * 4 + k < count; ++k) out[block * 4 + k] = z[k];
  }
}

class SyntheticDataset : public Dataset {
 public:
  SyntheticDataset(std::vector<FeedSpec> feeds, FeedRoles roles, int64_t size, int64_t classes, bool default_classes,
                   int64_t vocab, bool default_vocab, bool test, uint64_t seed)
      : Dataset(std::move(feeds), roles.label),
        roles_(std::move(roles)),
        size_(size),
        classes_(classes),
        default_classes_(default_classes),
        vocab_(vocab),
        default_vocab_(default_vocab),
        test_(test),
        teacher_label_(roles_.label >= 0 && (roles_.tokens.size() < 2 || roles_.label != roles_.tokens[1])),
        features_gen_(MixKey(seed, Fnv1a64("strata.synthetic.features"))),
        tokens_gen_(MixKey(seed, Fnv1a64("strata.synthetic.tokens"))) {
    for (int f : roles_.features) num_features_ += roles_.elements_per_sample[f];
    if (teacher_label_) BuildTeacher(seed);
  }

  int64_t size() const override { return size_; }
  // Its samples are a function of (seed, index): the seed is compared apart.
  std::string identity() const override {
    return absl::StrCat("synthetic ", test_ ? "test" : "train", " ", size_, " samples ", classes_, " classes",
                        roles_.tokens.empty() ? "" : absl::StrCat(" vocab ", vocab_));
  }
  int64_t num_classes() const override { return teacher_label_ ? classes_ : vocab_; }
  // Any class may win the teacher's argmax, any id below vocab be drawn: the
  // bound is the count, not a scan. Token programs are checked on their tokens.
  LargestLabel largest_label() const override {
    if (teacher_label_) {
      return {classes_ - 1,
              absl::StrCat("label ", classes_ - 1,
                           default_classes_ ? absl::StrCat(" of the default ", classes_, " synthetic classes") : ""),
              "classes"};
    }
    if (roles_.tokens.empty()) return {};
    return {vocab_ - 1,
            absl::StrCat("token ", vocab_ - 1,
                         default_vocab_ ? absl::StrCat(" of the default ", vocab_, " synthetic vocab") : ""),
            "vocab", "tokens", "vocab"};
  }

  absl::Status GetBatch(absl::Span<const int64_t> indices, std::vector<Tensor>* out) const override {
    if (absl::Status s = CheckIndices(indices, size()); !s.ok()) return s;
    if (absl::Status s = AllocateBatch(feeds(), indices.size(), allocator(), out); !s.ok()) return s;
    if (!roles_.tokens.empty()) FillTokens(indices, out);
    if (num_features_ == 0) return absl::OkStatus();
    // Samples split over threads; a chunk holds about 2^18 multiply-adds.
    const int64_t cost = num_features_ * (teacher_label_ ? kTeacherHidden + 8 : 8);
    const int64_t chunk = std::max<int64_t>(1, (int64_t{1} << 18) / std::max<int64_t>(cost, 1));
    if (size_ * num_features_ * static_cast<int64_t>(sizeof(double)) > kMaxSyntheticCacheBytes) {
      ParallelFor(indices.size(), chunk, [&](int64_t begin, int64_t end) {
        std::vector<double> x(num_features_);
        for (int64_t b = begin; b < end; ++b) WriteSample(x.data(), ComputeSample(indices[b], x.data()), b, out);
      });
      return absl::OkStatus();
    }
    // Computed on first use and kept; a batch's indices are distinct, so
    // each sample is computed by one thread.
    absl::MutexLock lock(&cache_mu_);
    if (cached_.empty()) {
      cache_x_.resize(size_ * num_features_);
      cache_label_.resize(size_);
      cached_.assign(size_, 0);
    }
    ParallelFor(indices.size(), chunk, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        const int64_t i = indices[b];
        double* x = cache_x_.data() + i * num_features_;
        if (!cached_[i]) {
          cache_label_[i] = ComputeSample(i, x);
          cached_[i] = 1;
        }
        WriteSample(x, cache_label_[i], b, out);
      }
    });
    return absl::OkStatus();
  }

 private:
  // Teacher: logits = W2 tanh(W1 x / sqrt(D)) + b2. No hidden bias and unit-norm
  // rows of W2 keep the classes near balance when the hidden layer is isotropic
  // (many features); with few features, b2 is calibrated to balance them.
  void BuildTeacher(uint64_t seed) {
    Philox gen(MixKey(seed, Fnv1a64("strata.synthetic.teacher")));
    std::vector<double> buffer(std::max<int64_t>(num_features_, kTeacherHidden));
    w1_.resize(kTeacherHidden * num_features_);
    const double scale = 1.0 / std::sqrt(static_cast<double>(num_features_));
    for (int h = 0; h < kTeacherHidden; ++h) {
      FillNormals(gen, h, num_features_, buffer.data());
      for (int64_t j = 0; j < num_features_; ++j) w1_[h * num_features_ + j] = static_cast<float>(buffer[j] * scale);
    }
    w2_.resize(classes_ * kTeacherHidden);
    for (int64_t k = 0; k < classes_; ++k) {
      double* row = w2_.data() + k * kTeacherHidden;
      FillNormals(gen, kTeacherHidden + k, kTeacherHidden, row);
      double norm = 0;
      for (int h = 0; h < kTeacherHidden; ++h) norm += row[h] * row[h];
      norm = std::sqrt(norm);
      for (int h = 0; h < kTeacherHidden; ++h) row[h] /= norm;
    }
    b2_.assign(classes_, 0.0);
    if (num_features_ <= kCalibrateMaxFeatures && classes_ <= kCalibrateMaxClasses) CalibrateClassBiases(seed);
  }

  // Balances the classes on calibration samples (their own stream, disjoint from
  // train and test): a decaying-step iteration b2 += step * (1/K - frequency),
  // the dual ascent of a balanced assignment.
  void CalibrateClassBiases(uint64_t seed) {
    const Philox gen(MixKey(seed, Fnv1a64("strata.synthetic.calibration")));
    std::vector<double> logits(kCalibrationSamples * classes_);
    ParallelFor(kCalibrationSamples, 64, [&](int64_t begin, int64_t end) {
      std::vector<double> x(num_features_);
      double hidden[kTeacherHidden];
      for (int64_t i = begin; i < end; ++i) {
        FillNormals(gen, i, num_features_, x.data());
        Hidden(x.data(), hidden);
        for (int64_t k = 0; k < classes_; ++k) logits[i * classes_ + k] = Logit(hidden, k);
      }
    });
    std::vector<int64_t> counts(classes_);
    for (int iteration = 0; iteration < kCalibrationIterations; ++iteration) {
      std::fill(counts.begin(), counts.end(), 0);
      for (int64_t i = 0; i < kCalibrationSamples; ++i) ++counts[ArgMax(logits.data() + i * classes_)];
      const double step = 0.5 / (1.0 + iteration / 10.0);
      for (int64_t k = 0; k < classes_; ++k) {
        b2_[k] += step * (1.0 / classes_ - static_cast<double>(counts[k]) / kCalibrationSamples);
      }
    }
  }

  void Hidden(const double* x, double* hidden) const {
    for (int h = 0; h < kTeacherHidden; ++h) {
      const float* w = w1_.data() + h * num_features_;
      double acc = 0;
      for (int64_t j = 0; j < num_features_; ++j) acc += w[j] * x[j];
      hidden[h] = std::tanh(acc);
    }
  }

  double Logit(const double* hidden, int64_t k) const {
    const double* w = w2_.data() + k * kTeacherHidden;
    double logit = 0;
    for (int h = 0; h < kTeacherHidden; ++h) logit += w[h] * hidden[h];
    return logit;
  }

  // argmax over classes of logits + b2; the first on ties.
  int64_t ArgMax(const double* logits) const {
    int64_t best = 0;
    for (int64_t k = 1; k < classes_; ++k) {
      if (logits[k] + b2_[k] > logits[best] + b2_[best]) best = k;
    }
    return best;
  }

  // Sample `index`'s features into x (num_features_, each as its feed's
  // dtype holds it) and its label (-1 without a label feed).
  int64_t ComputeSample(int64_t index, double* x) const {
    const uint64_t row = static_cast<uint64_t>(index) | (test_ ? kTestSampleBit : 0);
    FillNormals(features_gen_, row, num_features_, x);
    int64_t offset = 0;
    for (int f : roles_.features) {
      const int64_t n = roles_.elements_per_sample[f];
      if (feeds()[f].dtype == F32) {
        // The teacher sees exactly what the model sees.
        for (int64_t j = 0; j < n; ++j) x[offset + j] = static_cast<float>(x[offset + j]);
      }
      offset += n;
    }
    return teacher_label_ ? TeacherLabel(x) : -1;
  }

  // Token feeds: sample i is a sequence of T + 1 uniform ids below vocab keyed
  // by (seed, i); the tokens feed gets its first T, the targets its last T, as
  // a window of a token file does.
  void FillTokens(absl::Span<const int64_t> indices, std::vector<Tensor>* out) const {
    const int64_t seq = feeds()[roles_.tokens[0]].shape[1];
    ParallelFor(indices.size(), 64, [&](int64_t begin, int64_t end) {
      std::vector<int64_t> window(seq + 1);
      for (int64_t b = begin; b < end; ++b) {
        const uint64_t row = static_cast<uint64_t>(indices[b]) | (test_ ? kTestSampleBit : 0);
        for (int64_t block = 0; block * 4 < seq + 1; ++block) {
          std::array<double, 4> u = tokens_gen_.Uniform4(row, block);
          for (int k = 0; k < 4 && block * 4 + k < seq + 1; ++k) {
            window[block * 4 + k] = std::min<int64_t>(vocab_ - 1, static_cast<int64_t>(u[k] * vocab_));
          }
        }
        for (size_t k = 0; k < roles_.tokens.size(); ++k) {
          std::copy(window.begin() + k, window.begin() + k + seq, (*out)[roles_.tokens[k]].data<int64_t>() + b * seq);
        }
      }
    });
  }

  // Writes a sample at batch position b of every feed.
  void WriteSample(const double* x, int64_t label, int64_t b, std::vector<Tensor>* out) const {
    int64_t offset = 0;
    for (int f : roles_.features) {
      const int64_t n = roles_.elements_per_sample[f];
      Tensor& t = (*out)[f];
      if (t.dtype() == F32) {
        float* dst = t.data<float>() + b * n;
        for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<float>(x[offset + j]);
      } else {
        std::copy(x + offset, x + offset + n, t.data<double>() + b * n);
      }
      offset += n;
    }
    if (teacher_label_) (*out)[label_feed()].data<int64_t>()[b] = label;
  }

  int64_t TeacherLabel(const double* x) const {
    double hidden[kTeacherHidden];
    Hidden(x, hidden);
    std::vector<double> logits(classes_);
    for (int64_t k = 0; k < classes_; ++k) logits[k] = Logit(hidden, k);
    return ArgMax(logits.data());
  }

  FeedRoles roles_;
  int64_t size_;
  int64_t classes_;
  bool default_classes_;  // no classes= in the spec
  int64_t vocab_;         // token ids are below it
  bool default_vocab_;    // no vocab= in the spec
  bool test_;
  bool teacher_label_;  // the label feed is the I64 [-1] one, labelled by the teacher (not token targets)
  Philox features_gen_;
  Philox tokens_gen_;
  int64_t num_features_ = 0;
  std::vector<float> w1_;   // [hidden, features]
  std::vector<double> w2_;  // [classes, hidden]
  std::vector<double> b2_;  // [classes]
  // Samples computed so far (see GetBatch), when they fit kMaxSyntheticCacheBytes.
  mutable absl::Mutex cache_mu_;
  mutable std::vector<double> cache_x_;        // [size, features]
  mutable std::vector<int64_t> cache_label_;   // [size]
  mutable std::vector<uint8_t> cached_;        // [size]: 1 once computed
};

absl::StatusOr<std::unique_ptr<Dataset>> OpenSyntheticDataset(SpecArgs& args, const std::vector<FeedSpec>& feeds,
                                                              uint64_t seed, int64_t default_classes_hint) {
  const bool default_classes = !args.Has("classes");
  const int64_t fallback =
      default_classes_hint >= 2 && default_classes_hint <= kMaxSyntheticClasses ? default_classes_hint : 10;
  absl::StatusOr<int64_t> classes = args.TakeInt("classes", fallback, 2, kMaxSyntheticClasses);
  if (!classes.ok()) return classes.status();
  const bool default_vocab = !args.Has("vocab");
  absl::StatusOr<int64_t> vocab = args.TakeInt(
      "vocab", default_classes_hint >= 1 && default_classes_hint <= kMaxSyntheticVocab ? default_classes_hint : 256, 1,
      kMaxSyntheticVocab);
  if (!vocab.ok()) return vocab.status();
  absl::StatusOr<int64_t> size = args.TakeInt("size", 8192, 1, kMaxSyntheticSize);
  if (!size.ok()) return size.status();
  absl::StatusOr<bool> test = args.TakeSplit();
  if (!test.ok()) return test.status();
  if (absl::Status s = args.Finish({"classes", "vocab", "size", "train", "test"}); !s.ok()) return s;

  absl::StatusOr<FeedRoles> roles = ClassifyFeeds(feeds);
  if (!roles.ok()) return roles.status();
  if (roles->features.empty() && roles->tokens.empty()) {
    return absl::InvalidArgumentError(
        "synthetic data needs at least one floating (F32/F64) feature feed or I64[-1, T] token feed");
  }
  const bool teacher_label = roles->label >= 0 && (roles->tokens.size() < 2 || roles->label != roles->tokens[1]);
  if (!teacher_label && !default_classes) {
    // classes= would be silently ignored: the ids drawn are bounded by vocab=.
    return args.Error(absl::StrCat("sets 'classes', the labels of an I64[-1] label feed, but the program has none",
                                   roles->tokens.empty()
                                       ? ""
                                       : absl::StrCat("; its token feed '", feeds[roles->tokens[0]].name,
                                                      "' takes ids below vocab= (default: the program's)")));
  }
  if (roles->tokens.empty() && !default_vocab) {
    return args.Error("sets 'vocab', the ids of I64[-1, T] token feeds, but the program has none");
  }
  if (teacher_label && roles->features.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic labels for feed '", feeds[roles->label].name,
                                                   "' come from a teacher over floating (F32/F64) feature feeds; "
                                                   "the program has none"));
  }
  int64_t num_features = 0;
  for (int f : roles->features) num_features += roles->elements_per_sample[f];
  if (teacher_label && num_features > kMaxSyntheticFeatures) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic labels come from a teacher over at most ",
                                                   kMaxSyntheticFeatures, " features per sample; the feature feeds have ",
                                                   num_features));
  }
  return std::unique_ptr<Dataset>(new SyntheticDataset(feeds, *std::move(roles), *size, *classes, default_classes,
                                                       *vocab, default_vocab, *test, seed));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(const std::string& spec, const std::vector<FeedSpec>& feeds,
                                                     uint64_t seed, int64_t default_classes) {
  absl::StatusOr<SpecArgs> args = SpecArgs::Parse(spec);
  if (!args.ok()) return args.status();
  if (args->name() == "fashion_mnist") return OpenIdxDataset(*args, feeds, kFashionMnistDir);
  if (args->name() == "mnist") return OpenIdxDataset(*args, feeds, "");
  if (args->name() == "synthetic") return OpenSyntheticDataset(*args, feeds, seed, default_classes);
  if (args->name() == "tokens") return OpenTokenDataset(*args, feeds);
  return args->Error(
      absl::StrCat("names unknown dataset '", args->name(), "' (expected fashion_mnist, mnist, synthetic or tokens)"));
}

std::string LabelFeedName(const std::vector<FeedSpec>& feeds) {
  absl::StatusOr<FeedRoles> roles = ClassifyFeeds(feeds);
  return roles.ok() && roles->label >= 0 ? feeds[roles->label].name : std::string();
}

LabelConsumer FindLabelConsumer(const Program& program, const std::string& label_feed) {
  std::map<std::string, const Var*> vars;
  for (const Var& v : program.var()) vars.emplace(v.name(), &v);
  LabelConsumer tightest;
  for (const Op& op : program.op()) {
    if (op.input_size() < 2 || op.input(1) != label_feed) continue;
    auto logits = vars.find(op.input(0));
    if (logits == vars.end() || !IsFloating(logits->second->dtype()) || logits->second->shape_size() < 2) continue;
    const int64_t classes = logits->second->shape(logits->second->shape_size() - 1);
    if (classes < 1 || (tightest.classes > 0 && classes >= tightest.classes)) continue;
    tightest.classes = classes;
    const std::vector<int64_t> shape(logits->second->shape().begin(), logits->second->shape().end());
    tightest.what = absl::StrCat("op #", op.uid(), " '", op.type(), "'",
                                 op.name().empty() ? "" : absl::StrCat(" (", op.name(), ")"), " has ", classes,
                                 " classes (logits '", op.input(0), "' ", ShapeString(shape), ")");
  }
  return tightest;
}

std::string TokenFeedName(const std::vector<FeedSpec>& feeds) {
  absl::StatusOr<FeedRoles> roles = ClassifyFeeds(feeds);
  return roles.ok() && !roles->tokens.empty() ? feeds[roles->tokens[0]].name : std::string();
}

LabelConsumer FindTokenConsumer(const Program& program, const std::string& token_feed) {
  std::map<std::string, const Var*> vars;
  for (const Var& v : program.var()) vars.emplace(v.name(), &v);
  LabelConsumer tightest;
  for (const Op& op : program.op()) {
    if (op.input_size() < 2 || op.input(0) != token_feed) continue;
    auto table = vars.find(op.input(1));
    if (table == vars.end() || !IsFloating(table->second->dtype()) || table->second->shape_size() != 2) continue;
    const int64_t rows = table->second->shape(0);
    if (rows < 1 || (tightest.classes > 0 && rows >= tightest.classes)) continue;
    tightest.classes = rows;
    const std::vector<int64_t> shape(table->second->shape().begin(), table->second->shape().end());
    tightest.what = absl::StrCat("op #", op.uid(), " '", op.type(), "'",
                                 op.name().empty() ? "" : absl::StrCat(" (", op.name(), ")"), " has a table of ", rows,
                                 " rows ('", op.input(1), "' ", ShapeString(shape), ")");
  }
  // A token feed that is itself the loss's targets (no input tokens beside it).
  const LabelConsumer loss = FindLabelConsumer(program, token_feed);
  if (loss.classes > 0 && (tightest.classes <= 0 || loss.classes < tightest.classes)) tightest = loss;
  return tightest;
}

absl::Status CheckLabelsFit(const Dataset& data, const LabelConsumer& consumer, const std::string& flag) {
  if (consumer.classes <= 0) return absl::OkStatus();
  const Dataset::LargestLabel largest = data.largest_label();
  if (largest.label < consumer.classes) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": ", largest.noun, " run to ", largest.label, ", but ", consumer.what, ", so ", largest.what,
                   " is outside the ", largest.range, " [0, ", consumer.classes, ")",
                   largest.classes_key.empty() || consumer.classes < 2
                       ? ""
                       : absl::StrCat(" (", largest.classes_key, "=", consumer.classes, " fits)")));
}

std::vector<int64_t> EpochOrder(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(std::max<int64_t>(size, 0));
  for (int64_t i = 0; i < size; ++i) order[i] = i;
  const Philox gen(MixKey(seed, static_cast<uint64_t>(epoch)));
  uint64_t counter = 0;
  auto next64 = [&] {
    Philox::Block r = gen({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0});
    ++counter;
    return (uint64_t{r[0]} << 32) | r[1];
  };
  for (int64_t i = size - 1; i > 0; --i) {
    // Uniform j in [0, i] by rejection, free of modulo bias.
    const uint64_t bound = static_cast<uint64_t>(i) + 1;
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t r;
    do {
      r = next64();
    } while (r >= limit);
    std::swap(order[i], order[r % bound]);
  }
  return order;
}

}  // namespace strata
