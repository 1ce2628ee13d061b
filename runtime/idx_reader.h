#ifndef STRATA_RUNTIME_IDX_READER_H_
#define STRATA_RUNTIME_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace strata {

// An IDX file of unsigned bytes (the MNIST family's format): big-endian magic
// 0x00 0x00 0x08 <rank>, then <rank> big-endian uint32 dims, then the data.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major, product(dims) bytes
};

// Reads a gzip'd or plain IDX file (zlib reads both transparently). Errors
// name the path and what was wrong: missing, truncated, trailing bytes, bad
// magic, element type other than ubyte, absurd dims.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// Images [N, rows, cols] and labels [N], each label in [0, num_classes).
struct IdxImagesAndLabels {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // [count, rows, cols]
  std::vector<uint8_t> labels;  // [count]
};

// Reads an image file (rank 3) and its label file (rank 1) and checks that
// they agree on the sample count and that every label is below num_classes.
absl::StatusOr<IdxImagesAndLabels> ReadIdxImagesAndLabels(const std::string& images_path,
                                                          const std::string& labels_path,
                                                          int64_t num_classes);

}  // namespace strata

#endif  // STRATA_RUNTIME_IDX_READER_H_
