#ifndef STRATA_KERNELS_COPY_PLAN_H_
#define STRATA_KERNELS_COPY_PLAN_H_

// How a strided copy (transpose, concat, split, slice and their gradients:
// a box of one tensor to a box of another) is laid out for the GPU's copy
// kernels (kernels/cuda/strided_copy.cu). Plain C++ without CUDA, so the
// CPU tests check what the kernels will be handed.
//
// Two steps shape a copy before launch:
// - MakeCopyPlan merges the dims that are contiguous in both sides and drops
//   size-1 dims, so a [8, 1024, 12, 64] -> [8, 12, 1024, 64] transpose is a
//   4-dim plan whose innermost 64 elements are contiguous in both.
// - WidenCopyPlan then moves that contiguous run in chunks of up to 16
//   bytes: each thread of the kernel copies one chunk instead of one 2-byte
//   element, so a bf16 transpose computes one set of offsets per 8 elements
//   and loads and stores 16 bytes at a time. Chunks must divide the run,
//   every outer stride and both base addresses.

#include <cstdint>

namespace strata {

inline constexpr int kMaxCopyDims = 8;

// The dims of the copied box (outermost first) and each side's stride along
// them in elements, passed to the kernels by value.
struct CopyPlan {
  int rank = 0;
  int64_t dims[kMaxCopyDims] = {};
  int64_t dst_strides[kMaxCopyDims] = {};
  int64_t src_strides[kMaxCopyDims] = {};
  int64_t count = 1;  // product of dims: 0 for an empty box
};

// The plan of a box of dims box[rank] at element strides dst_strides and
// src_strides: dims contiguous in both sides merged, size-1 dims dropped.
// False when more than kMaxCopyDims dims are left after merging.
inline bool MakeCopyPlan(int rank, const int64_t* box, const int64_t* dst_strides, const int64_t* src_strides,
                         CopyPlan* plan) {
  *plan = CopyPlan();
  CopyPlan inner_first;  // innermost first while merging; reversed at the end
  int n = 0;
  for (int d = rank - 1; d >= 0; --d) {
    if (box[d] == 0) {
      plan->count = 0;
      return true;
    }
    if (box[d] == 1) continue;
    if (n > 0 && dst_strides[d] == inner_first.dst_strides[n - 1] * inner_first.dims[n - 1] &&
        src_strides[d] == inner_first.src_strides[n - 1] * inner_first.dims[n - 1]) {
      inner_first.dims[n - 1] *= box[d];  // contiguous in both: one dim
      continue;
    }
    if (n == kMaxCopyDims) return false;
    inner_first.dims[n] = box[d];
    inner_first.dst_strides[n] = dst_strides[d];
    inner_first.src_strides[n] = src_strides[d];
    ++n;
  }
  plan->rank = n;
  for (int k = 0; k < n; ++k) {
    plan->dims[k] = inner_first.dims[n - 1 - k];
    plan->dst_strides[k] = inner_first.dst_strides[n - 1 - k];
    plan->src_strides[k] = inner_first.src_strides[n - 1 - k];
    plan->count *= plan->dims[k];
  }
  return true;
}

// The widest chunk, in bytes (16, 8, 4, 2 or element_size itself), that the
// copy of `plan` can move per thread: the innermost dim contiguous in both
// sides, and the chunk dividing its length, every other stride and both
// base addresses (byte addresses, as integers).
inline int CopyChunkBytes(const CopyPlan& plan, int element_size, uint64_t dst_address, uint64_t src_address) {
  const int r = plan.rank;
  if (r == 0 || plan.count == 0 || plan.dst_strides[r - 1] != 1 || plan.src_strides[r - 1] != 1) {
    return element_size;
  }
  for (int chunk = 16; chunk > element_size; chunk /= 2) {
    if (chunk % element_size != 0) continue;
    const int64_t k = chunk / element_size;  // elements a chunk
    bool fits = plan.dims[r - 1] % k == 0 && dst_address % chunk == 0 && src_address % chunk == 0;
    for (int d = 0; fits && d < r - 1; ++d) fits = plan.dst_strides[d] % k == 0 && plan.src_strides[d] % k == 0;
    if (fits) return chunk;
  }
  return element_size;
}

// `plan` in units of chunk_bytes (a value CopyChunkBytes returned for it):
// the innermost dim and every stride divided by chunk_bytes / element_size,
// then merged again, so a run that became one chunk wide joins the dim
// outside it (a concat of [N, 8] bf16 parts into [N, 16] is one dim of N
// chunks, not [N, 1], which the tiled transpose would take).
inline CopyPlan WidenCopyPlan(const CopyPlan& plan, int element_size, int chunk_bytes) {
  const int64_t k = chunk_bytes / element_size;
  if (k <= 1 || plan.rank == 0) return plan;
  const int r = plan.rank;
  int64_t dims[kMaxCopyDims], dst[kMaxCopyDims], src[kMaxCopyDims];
  for (int d = 0; d < r; ++d) {
    dims[d] = d == r - 1 ? plan.dims[d] / k : plan.dims[d];
    dst[d] = d == r - 1 ? 1 : plan.dst_strides[d] / k;
    src[d] = d == r - 1 ? 1 : plan.src_strides[d] / k;
  }
  CopyPlan wide;
  MakeCopyPlan(r, dims, dst, src, &wide);  // no more dims than it had: cannot fail
  return wide;
}

// Whether the count and every element offset of the plan stay below 2^30,
// so a kernel may index with int32 (64-bit division on a GPU is several
// times slower); the margin up to 2^31 leaves room for a grid-stride loop's
// last increment (at most 2^24 threads a grid) without overflow.
inline bool CopyPlanFitsInt32(const CopyPlan& plan) {
  constexpr int64_t kMax = int64_t{1} << 30;
  int64_t dst_last = 0, src_last = 0;  // offsets of the last element, the largest with strides >= 0
  for (int d = 0; d < plan.rank; ++d) {
    if (plan.dst_strides[d] < 0 || plan.src_strides[d] < 0) return false;
    if (plan.dims[d] <= 0) continue;
    dst_last += (plan.dims[d] - 1) * plan.dst_strides[d];
    src_last += (plan.dims[d] - 1) * plan.src_strides[d];
  }
  return plan.count < kMax && dst_last < kMax && src_last < kMax && dst_last >= 0 && src_last >= 0;
}

}  // namespace strata

#endif  // STRATA_KERNELS_COPY_PLAN_H_
