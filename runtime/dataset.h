#ifndef STRATA_RUNTIME_DATASET_H_
#define STRATA_RUNTIME_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/program.pb.h"
#include "runtime/tensor.h"

namespace strata {

// A program's FEED var as a dataset sees it.
struct FeedSpec {
  std::string name;
  DataType dtype = DT_INVALID;
  std::vector<int64_t> shape;  // shape[0] == -1, the batch dim
};

// Samples addressed by global index, so every parallel layout that knows
// which indices it owns reads the same data as one device does.
class Dataset {
 public:
  explicit Dataset(std::vector<FeedSpec> feeds, int label_feed)
      : feeds_(std::move(feeds)), label_feed_(label_feed) {}
  virtual ~Dataset() = default;
  Dataset(const Dataset&) = delete;
  Dataset& operator=(const Dataset&) = delete;

  virtual int64_t size() const = 0;  // number of samples
  virtual int64_t num_classes() const = 0;
  // Fills one tensor per feed, in feeds() order (shape: the feed's shape with the
  // batch dim = indices.size()), with samples `indices`. OutOfRange for an index
  // outside [0, size()). Safe to call from several threads at once.
  virtual absl::Status GetBatch(absl::Span<const int64_t> indices, std::vector<Tensor>* out) const = 0;

  const std::vector<FeedSpec>& feeds() const { return feeds_; }
  // Where batches are allocated (the reading rank's allocator, so its byte
  // counters see them).
  void set_allocator(Allocator* allocator) { allocator_ = allocator; }
  Allocator* allocator() const { return allocator_; }
  // Index into feeds() of the label feed (the I64 feed of shape [-1]), -1 if none.
  int label_feed() const { return label_feed_; }

 private:
  std::vector<FeedSpec> feeds_;
  int label_feed_;
  Allocator* allocator_ = GetCpuAllocator();
};

// Opens a dataset for a program's feeds. Specs:
//   fashion_mnist[:train|:test][,path=DIR]   Debian's dataset-fashion-mnist unless path= is given
//   mnist:path=DIR[,train|,test]              the same IDX layout, from DIR
//   synthetic[:classes=K][,size=N][,train|,test]   defaults classes=10, size=8192
// The single I64 feed of shape [-1] (if any) gets labels; floating feeds get
// features. IDX datasets need one floating feed of rows*cols elements per sample:
// [-1, rows*cols], [-1, 1, rows, cols] or [-1, rows, cols], pixels scaled to [0, 1].
// Synthetic features are standard normals keyed by (seed, sample index); labels
// are the argmax of a fixed random one-hidden-layer tanh teacher drawn from seed,
// and `test` draws a held-out set disjoint from the training samples.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(const std::string& spec, const std::vector<FeedSpec>& feeds,
                                                     uint64_t seed);

// Sample order of an epoch: a permutation of [0, size) that depends only on
// (seed, epoch): Fisher-Yates driven by Philox keyed by MixKey(seed, epoch).
std::vector<int64_t> EpochOrder(int64_t size, uint64_t seed, int64_t epoch);

}  // namespace strata

#endif  // STRATA_RUNTIME_DATASET_H_
