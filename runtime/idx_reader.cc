#include "runtime/idx_reader.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata {
namespace {

// Far above any MNIST-family file (47 MB); a bogus header cannot make us allocate more.
constexpr int64_t kMaxIdxBytes = int64_t{1} << 32;
constexpr int kMaxIdxRank = 8;
constexpr unsigned kChunkBytes = 1u << 20;

// Closes the gzFile on every return path.
class GzFile {
 public:
  explicit GzFile(gzFile f) : f_(f) {}
  ~GzFile() {
    if (f_ != nullptr) gzclose(f_);
  }
  GzFile(const GzFile&) = delete;
  GzFile& operator=(const GzFile&) = delete;
  gzFile get() const { return f_; }

 private:
  gzFile f_;
};

std::string GzErrorText(gzFile f) {
  int code = 0;
  const char* msg = gzerror(f, &code);
  if (code == Z_ERRNO) return std::strerror(errno);
  return msg != nullptr && *msg != '\0' ? msg : "read error";
}

// Reads up to n bytes; returns how many were read, or an error for a corrupt stream.
absl::StatusOr<int64_t> ReadUpTo(gzFile f, const std::string& path, uint8_t* dst, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    unsigned want = static_cast<unsigned>(std::min<int64_t>(n - done, kChunkBytes));
    int got = gzread(f, dst + done, want);
    if (got < 0) return absl::DataLossError(absl::StrCat(path, ": cannot read: ", GzErrorText(f)));
    if (got == 0) break;
    done += got;
  }
  return done;
}

uint32_t BigEndian32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) return absl::FailedPreconditionError(absl::StrCat(path, ": not a regular file"));
  GzFile file(gzopen(path.c_str(), "rb"));
  if (file.get() == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  gzbuffer(file.get(), 1 << 17);

  uint8_t magic[4];
  absl::StatusOr<int64_t> got = ReadUpTo(file.get(), path, magic, 4);
  if (!got.ok()) return got.status();
  if (*got < 4) return absl::DataLossError(absl::StrCat(path, ": truncated IDX file: ", *got, " of 4 magic bytes"));
  if (magic[0] != 0 || magic[1] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an IDX file: magic starts with bytes ",
                                                   magic[0], " ", magic[1], ", expected 0 0"));
  }
  if (magic[2] != 0x08) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": IDX element type 0x", absl::Hex(magic[2]), " is not supported, expected 0x08 (unsigned byte)"));
  }
  const int rank = magic[3];
  if (rank < 1 || rank > kMaxIdxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": IDX rank ", rank, " is out of range, expected 1..", kMaxIdxRank));
  }

  uint8_t dim_bytes[4 * kMaxIdxRank];
  got = ReadUpTo(file.get(), path, dim_bytes, 4 * rank);
  if (!got.ok()) return got.status();
  if (*got < 4 * rank) {
    return absl::DataLossError(absl::StrCat(path, ": truncated IDX header: ", *got, " of ", 4 * rank, " dim bytes"));
  }
  IdxArray array;
  int64_t total = 1;
  for (int i = 0; i < rank; ++i) {
    array.dims.push_back(BigEndian32(dim_bytes + 4 * i));
    // Both factors are below 2^33, so the product fits in 64 bits unsigned.
    uint64_t product = static_cast<uint64_t>(total) * static_cast<uint64_t>(array.dims.back());
    total = static_cast<int64_t>(std::min<uint64_t>(product, kMaxIdxBytes + 1));
    if (total > kMaxIdxBytes) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": IDX dims [", absl::StrJoin(array.dims, ", "),
                                                     "...] are absurd: more than ", kMaxIdxBytes, " bytes"));
    }
  }

  // Grow while reading, so a truncated file with a large header fails before a large allocation.
  array.data.reserve(static_cast<size_t>(std::min<int64_t>(total, 64 << 20)));
  while (static_cast<int64_t>(array.data.size()) < total) {
    int64_t before = array.data.size();
    int64_t step = std::min<int64_t>(total - before, 16 << 20);
    array.data.resize(before + step);
    got = ReadUpTo(file.get(), path, array.data.data() + before, step);
    if (!got.ok()) return got.status();
    if (*got < step) {
      return absl::DataLossError(absl::StrCat(path, ": truncated IDX data: dims [", absl::StrJoin(array.dims, ", "),
                                              "] need ", total, " bytes, file has ", before + *got));
    }
  }
  uint8_t extra;
  got = ReadUpTo(file.get(), path, &extra, 1);
  if (!got.ok()) return got.status();
  if (*got != 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": trailing bytes after the ", total,
                                                   " data bytes that dims [", absl::StrJoin(array.dims, ", "),
                                                   "] describe"));
  }
  return array;
}

absl::StatusOr<IdxImagesAndLabels> ReadIdxImagesAndLabels(const std::string& images_path,
                                                          const std::string& labels_path,
                                                          int64_t num_classes) {
  absl::StatusOr<IdxArray> images = ReadIdxFile(images_path);
  if (!images.ok()) return images.status();
  if (images->dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": image file has dims [",
                                                   absl::StrJoin(images->dims, ", "),
                                                   "], expected 3 dims [count, rows, cols]"));
  }
  absl::StatusOr<IdxArray> labels = ReadIdxFile(labels_path);
  if (!labels.ok()) return labels.status();
  if (labels->dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label file has dims [",
                                                   absl::StrJoin(labels->dims, ", "), "], expected 1 dim [count]"));
  }
  IdxImagesAndLabels out;
  out.count = images->dims[0];
  out.rows = images->dims[1];
  out.cols = images->dims[2];
  if (out.count == 0 || out.rows == 0 || out.cols == 0) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": image file has dims [",
                                                   absl::StrJoin(images->dims, ", "), "], expected no zero dim"));
  }
  if (labels->dims[0] != out.count) {
    return absl::InvalidArgumentError(absl::StrCat("image/label count mismatch: ", images_path, " has ", out.count,
                                                   " images, ", labels_path, " has ", labels->dims[0], " labels"));
  }
  for (int64_t i = 0; i < out.count; ++i) {
    if (labels->data[i] >= num_classes) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", static_cast<int>(labels->data[i]),
                                                     " at index ", i, " is out of range, expected 0..",
                                                     num_classes - 1));
    }
  }
  out.pixels = std::move(images->data);
  out.labels = std::move(labels->data);
  return out;
}

}  // namespace strata
