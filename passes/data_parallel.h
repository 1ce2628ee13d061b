#ifndef STRATA_PASSES_DATA_PARALLEL_H_
#define STRATA_PASSES_DATA_PARALLEL_H_

#include "compiler/pass.h"

namespace strata {

// Data parallelism over the mesh's dp axis, as PaddlePaddle's fleet and
// PyTorch DDP do it. Each rank's loss is the mean over its 1/D of the global
// batch, so the loss gradient's seed is scaled by 1/D; the gradients the
// optimizer reads are then summed over the rank's dp group (one per pipeline
// stage) in buckets of about `bucket_mb` (default 25), formed in the order
// backward finishes them:
//   - `bucket_allreduce` right after the op that finishes a bucket's last
//     gradient copies the bucket's gradients into a persistent flat buffer
//     (`@dp_bucket.K`) and posts its sum asynchronously; it acts once per
//     optimizer update, in the last micro-batch's backward (DDP's no_sync on
//     the others), so the sums overlap the rest of backward;
//   - `bucket_wait` just before the first optimizer op that reads one of the
//     bucket's gradients waits and copies the sums out (`<grad>@dp`), which
//     the optimizer block reads instead.
// Nothing changes at degree 1.
class DataParallelPass : public Pass {
 public:
  std::string name() const override { return "data-parallel"; }
  absl::StatusOr<bool> Run(Graph& graph, const CompileContext& ctx) override;
};

// The bucket size in bytes a strategy's `bucket_mb` asks for (0: 25 MiB).
int64_t BucketCapBytes(double bucket_mb);

}  // namespace strata

#endif  // STRATA_PASSES_DATA_PARALLEL_H_
