#ifndef STRATA_KERNELS_CUDA_REDUCE_H_
#define STRATA_KERNELS_CUDA_REDUCE_H_

// y = x summed over some of its dims (times a scale, for the mean), on the
// GPU, deterministically: every output element is summed by the same threads
// in the same order on every run (no atomics), in double for floating types
// and int64 for I64, as the CPU's ReduceSum accumulates. sum_to_like,
// reduce_sum and reduce_mean. Plain C++ API; asynchronous on `stream`.

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace strata {
namespace cuda {

// The kept dims (the output's, outermost first) and the reduced dims of x,
// each with x's element stride; adjacent dims of one kind merged, size-1 dims
// dropped. Passed by value.
inline constexpr int kMaxReduceDims = 8;
struct ReducePlan {
  int kept_rank = 0;
  int64_t kept_dims[kMaxReduceDims] = {};
  int64_t kept_strides[kMaxReduceDims] = {};
  int reduced_rank = 0;
  int64_t reduced_dims[kMaxReduceDims] = {};
  int64_t reduced_strides[kMaxReduceDims] = {};
  int64_t outputs = 1;  // product of kept_dims
  int64_t reduced = 1;  // product of reduced_dims: the terms of each sum
  double scale = 1.0;   // floating y = T(sum * scale), as the CPU's ReduceSum; I64 ignores it
};

// Fills *plan (keeping its scale) to sum x (row-major, dims x_dims[rank])
// over the dims flagged in `reduced` (one flag per dim). False when, after
// merging, the kept or the reduced dims form more than kMaxReduceDims groups.
bool MakeReducePlan(int rank, const int64_t* x_dims, const std::vector<bool>& reduced, ReducePlan* plan);

// y[plan.outputs] = sums of x over plan's reduced dims.
cudaError_t LaunchReduceSum(float* y, const float* x, const ReducePlan& plan, cudaStream_t stream);
cudaError_t LaunchReduceSum(double* y, const double* x, const ReducePlan& plan, cudaStream_t stream);
cudaError_t LaunchReduceSum(int64_t* y, const int64_t* x, const ReducePlan& plan, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_REDUCE_H_
