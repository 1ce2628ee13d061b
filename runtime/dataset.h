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
  // What ranks compare before the first step: the dataset's name, split,
  // size and a checksum of its contents' head, never its path (ranks on
  // other machines read their own copies), e.g.
  // "fashion_mnist train 60000 samples 28x28 head 3f2a...".
  virtual std::string identity() const = 0;
  virtual int64_t num_classes() const = 0;
  // The largest label GetBatch can hand out, checked against the program's
  // classes before the first step (CheckLabelsFit).
  struct LargestLabel {
    int64_t label = -1;  // -1: no labels
    // The label as the error names it: "label 7 at index 1", "label 9 of the
    // default 10 synthetic classes".
    std::string what;
    // The spec key that sets the number of classes ("classes"), empty if none.
    std::string classes_key;
    // What the values are and what bounds them: "labels" and "classes", or
    // "tokens" and "vocab" for token data.
    std::string noun = "labels";
    std::string range = "classes";
  };
  virtual LargestLabel largest_label() const = 0;
  // Fills one tensor per feed, in feeds() order (shape: the feed's shape with the
  // batch dim = indices.size()), with samples `indices`. OutOfRange for an index
  // outside [0, size()). Safe to call from several threads at once.
  virtual absl::Status GetBatch(absl::Span<const int64_t> indices, std::vector<Tensor>* out) const = 0;

  const std::vector<FeedSpec>& feeds() const { return feeds_; }
  // Where batches are allocated (the reading rank's allocator, so its byte
  // counters see them).
  void set_allocator(Allocator* allocator) { allocator_ = allocator; }
  Allocator* allocator() const { return allocator_; }
  // Index into feeds() of the label feed (the I64 feed of shape [-1], else the
  // targets of a token program), -1 if none.
  int label_feed() const { return label_feed_; }

 private:
  std::vector<FeedSpec> feeds_;
  int label_feed_;
  Allocator* allocator_ = GetCpuAllocator();
};

// Opens a dataset for a program's feeds. A spec is NAME[:OPTION,OPTION...]: the
// options follow one ':' after the name, separated by commas, in any order.
//   fashion_mnist[:train|test,path=DIR]     e.g. fashion_mnist:test,path=DIR or
//                                           fashion_mnist:path=DIR; Debian's
//                                           dataset-fashion-mnist unless path= is given
//   mnist:path=DIR[,train|test]             the same IDX layout, from DIR
//   synthetic[:classes=K,vocab=V,size=N,train|test] defaults size=8192 and
//                                           classes = vocab = `default_classes` when
//                                           given (the program's, see FindLabelConsumer
//                                           and FindTokenConsumer), else 10 classes and
//                                           a vocab of 256; classes= needs an I64[-1]
//                                           label feed the teacher fills, vocab= an
//                                           I64[-1, T] token feed
//   tokens:path=FILE[,vocab=V]              FILE: a flat file of little-endian uint16
//                                           token ids; vocab=V: every id must be below V
// Feeds get roles by dtype, shape and declaration order: floating feeds get
// features; the single I64 feed of shape [-1] (if any) gets labels; I64 feeds of
// shape [-1, T] get token ids, the first declared the input tokens and a second
// one (same T, no I64 [-1] feed beside it) the targets, which take the label role
// (so the loss that reads them bounds their ids, as it bounds labels). Token
// data is cut into non-overlapping windows of T + 1 ids: sample i is window i,
// the tokens feed gets its first T ids and the targets its last T; a partial
// last window is dropped, and an epoch's order is EpochOrder's as for every
// dataset. Synthetic token windows are uniform ids below vocab keyed by (seed,
// sample index). IDX datasets need one floating feed of rows*cols elements per sample:
// [-1, rows*cols], [-1, 1, rows, cols] or [-1, rows, cols], pixels scaled to [0, 1].
// Synthetic features are standard normals keyed by (seed, sample index); labels
// are the argmax of a fixed random one-hidden-layer tanh teacher drawn from seed,
// and `test` draws a held-out set disjoint from the training samples.
absl::StatusOr<std::unique_ptr<Dataset>> OpenDataset(const std::string& spec, const std::vector<FeedSpec>& feeds,
                                                     uint64_t seed, int64_t default_classes = 0);

// The op that accepts the fewest classes among those reading the label feed:
// ops with the label feed as their second input beside floating logits
// [..., C] as their first (softmax_cross_entropy, its gradient, accuracy).
struct LabelConsumer {
  int64_t classes = 0;  // 0: no op reads the labels
  // "op #2 'softmax_cross_entropy' has 3 classes (logits 'logits' [-1, 3])";
  // the op's index is its place in the user's program (Op.uid).
  std::string what;
};
LabelConsumer FindLabelConsumer(const Program& program, const std::string& label_feed);
// The feed a dataset fills with labels (the one I64 [-1] feed, else the
// targets of two I64 [-1, T] token feeds), or "".
std::string LabelFeedName(const std::vector<FeedSpec>& feeds);
// The feed a dataset fills with input token ids (the first I64 [-1, T] feed), or "".
std::string TokenFeedName(const std::vector<FeedSpec>& feeds);
// The op reading the token feed as its first input beside the smallest 2-D
// floating table [V, D] as its second (embedding): its V bounds the ids.
// `classes` holds V; "op #0 'embedding' has a table of 256 rows ('wte' [256, 16])".
// Where an op reads the feed as labels beside fewer logits' classes (a single
// token feed that is the loss's targets), that op (FindLabelConsumer).
LabelConsumer FindTokenConsumer(const Program& program, const std::string& token_feed);

// Fails, before any step runs, when `data`'s labels (or token ids) run past
// the classes of `consumer` (the loss or embedding kernel would refuse them
// mid-run). `flag` starts the message ("--data synthetic:classes=100"). OK when
// the data fills no label or token feed or no op reads it.
absl::Status CheckLabelsFit(const Dataset& data, const LabelConsumer& consumer, const std::string& flag);

// Sample order of an epoch: a permutation of [0, size) that depends only on
// (seed, epoch): Fisher-Yates driven by Philox keyed by MixKey(seed, epoch).
std::vector<int64_t> EpochOrder(int64_t size, uint64_t seed, int64_t epoch);

}  // namespace strata

#endif  // STRATA_RUNTIME_DATASET_H_
