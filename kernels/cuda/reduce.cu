// Sum over the reduced dims of x, one output element at a time.
// Blocks: with fewer than kBlockMinTerms terms per output, one thread sums
// each output element in index order (grid-stride over outputs). Otherwise
// one block per output element (grid-stride over outputs): thread t sums
// terms t, t + T, t + 2T, ... in order, then a fixed shared-memory tree adds
// the T partial sums. T depends on the shapes only, so the order of every
// addition, and the result's bits, are the same on every run.

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/cuda/reduce.h"

namespace strata {
namespace cuda {
namespace {

constexpr int kMaxThreads = 256;
constexpr int64_t kMaxBlocks = 65536;
constexpr int64_t kBlockMinTerms = 32;

template <typename T>
using Acc = std::conditional_t<std::is_floating_point<T>::value, double, int64_t>;

// y's value from the sum: sum * scale in double for floating T (the CPU's
// `acc * scale`; scale 1 changes no bit), the sum itself for I64.
__device__ double Scaled(double sum, double scale) { return sum * scale; }
__device__ int64_t Scaled(int64_t sum, double) { return sum; }

__device__ int64_t KeptOffset(const ReducePlan& p, int64_t o) {
  int64_t offset = 0;
  for (int d = p.kept_rank - 1; d >= 0; --d) {
    offset += (o % p.kept_dims[d]) * p.kept_strides[d];
    o /= p.kept_dims[d];
  }
  return offset;
}

__device__ int64_t ReducedOffset(const ReducePlan& p, int64_t k) {
  int64_t offset = 0;
  for (int d = p.reduced_rank - 1; d >= 0; --d) {
    offset += (k % p.reduced_dims[d]) * p.reduced_strides[d];
    k /= p.reduced_dims[d];
  }
  return offset;
}

template <typename T>
__global__ void ReducePerThreadKernel(T* y, const T* x, ReducePlan p) {
  for (int64_t o = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; o < p.outputs;
       o += int64_t{gridDim.x} * blockDim.x) {
    const T* base = x + KeptOffset(p, o);
    Acc<T> sum = 0;
    for (int64_t k = 0; k < p.reduced; ++k) sum += static_cast<Acc<T>>(base[ReducedOffset(p, k)]);
    y[o] = static_cast<T>(Scaled(sum, p.scale));
  }
}

// blockDim.x is a power of two <= kMaxThreads.
template <typename T>
__global__ void ReducePerBlockKernel(T* y, const T* x, ReducePlan p) {
  __shared__ Acc<T> partial[kMaxThreads];
  const int tid = threadIdx.x;
  for (int64_t o = blockIdx.x; o < p.outputs; o += gridDim.x) {
    const T* base = x + KeptOffset(p, o);
    Acc<T> sum = 0;
    for (int64_t k = tid; k < p.reduced; k += blockDim.x) sum += static_cast<Acc<T>>(base[ReducedOffset(p, k)]);
    partial[tid] = sum;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) partial[tid] += partial[tid + s];
      __syncthreads();
    }
    if (tid == 0) y[o] = static_cast<T>(Scaled(partial[0], p.scale));
    __syncthreads();  // partial[0] is read before the next output overwrites it
  }
}

template <typename T>
cudaError_t ReduceSum(T* y, const T* x, const ReducePlan& p, cudaStream_t stream) {
  if (p.outputs <= 0) return cudaSuccess;
  if (p.kept_rank < 0 || p.kept_rank > kMaxReduceDims || p.reduced_rank < 0 || p.reduced_rank > kMaxReduceDims) {
    return cudaErrorInvalidValue;
  }
  if (p.reduced < kBlockMinTerms) {
    const int64_t blocks = std::min(kMaxBlocks, (p.outputs + kMaxThreads - 1) / kMaxThreads);
    ReducePerThreadKernel<T><<<blocks, kMaxThreads, 0, stream>>>(y, x, p);
  } else {
    int threads = 32;
    while (threads < kMaxThreads && threads < p.reduced) threads *= 2;
    const int64_t blocks = std::min(kMaxBlocks, p.outputs);
    ReducePerBlockKernel<T><<<blocks, threads, 0, stream>>>(y, x, p);
  }
  return cudaGetLastError();
}

}  // namespace

bool MakeReducePlan(int rank, const int64_t* x_dims, const std::vector<bool>& reduced, ReducePlan* plan) {
  // x's dims without the size-1 ones, adjacent dims of one kind merged
  // (row-major, so the outer one's stride is the inner one's times its size).
  struct Dim {
    int64_t size, stride;
    bool reduced;
  };
  std::vector<Dim> dims;
  int64_t stride = 1;
  for (int d = rank - 1; d >= 0; --d) {
    const int64_t size = x_dims[d];
    if (size != 1) {
      if (!dims.empty() && dims.back().reduced == reduced[d]) {
        dims.back().size *= size;  // the inner stride stays
      } else {
        dims.push_back({size, stride, reduced[d]});
      }
    }
    stride *= size;
  }
  const double scale = plan->scale;
  *plan = ReducePlan();
  plan->scale = scale;
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {  // outermost first
    int& r = it->reduced ? plan->reduced_rank : plan->kept_rank;
    if (r == kMaxReduceDims) return false;
    (it->reduced ? plan->reduced_dims : plan->kept_dims)[r] = it->size;
    (it->reduced ? plan->reduced_strides : plan->kept_strides)[r] = it->stride;
    ++r;
    (it->reduced ? plan->reduced : plan->outputs) *= it->size;
  }
  return true;
}

cudaError_t LaunchReduceSum(float* y, const float* x, const ReducePlan& plan, cudaStream_t stream) {
  return ReduceSum(y, x, plan, stream);
}
cudaError_t LaunchReduceSum(double* y, const double* x, const ReducePlan& plan, cudaStream_t stream) {
  return ReduceSum(y, x, plan, stream);
}
cudaError_t LaunchReduceSum(int64_t* y, const int64_t* x, const ReducePlan& plan, cudaStream_t stream) {
  return ReduceSum(y, x, plan, stream);
}

}  // namespace cuda
}  // namespace strata
