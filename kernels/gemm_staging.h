#ifndef STRATA_KERNELS_GEMM_STAGING_H_
#define STRATA_KERNELS_GEMM_STAGING_H_

// Which operands of a GPU GEMM are staged through scratch with an aligned
// row pitch, and how many scratch bytes that takes: plain C++, shared by the
// CUDA GEMM (kernels/cuda/gemm.cc), the memory plan's workspace functions
// for the matmul family on CUDA (kernels/cuda/cuda_ops.cc), and a CPU test.
//
// cuBLASLt picks its fast (tensor-core, vectorised) kernels only when every
// row of every operand starts on a 16-byte boundary. A row-major operand
// whose row is not a multiple of 16 bytes (GPT-2's logits and their
// gradient, [8192, 50257] in bf16: rows of 100514 bytes) gets kernels 4-6x
// slower (bench/README.md, gemm: the LM head's three GEMMs at 97-150
// TFLOP/s, the blocks' at 500-720, in Strata and PyTorch alike). Staged, the
// operand is copied (cudaMemcpy2DAsync) into scratch whose rows are padded
// to the next 16 bytes, the GEMM reads (or, for c, writes) it there with
// that leading dimension, and c is copied back: two passes over the
// operand's bytes, about 0.4 ms for the logits on an H100/H200, against
// several ms of GEMM saved. Only GEMMs of at least kStagingMinFlops are
// staged, where the copy is small beside the GEMM.

#include <cstdint>

namespace strata {
namespace cuda {

inline constexpr int64_t kPitchAlignBytes = 16;
// 2 m n k at or above which a misaligned GEMM is staged (about 1.5 ms of
// the slow kernels, 0.1 ms of the copies' worst case at that size).
inline constexpr double kStagingMinFlops = 1e10;
// Each staged operand starts on this boundary in the scratch.
inline constexpr int64_t kStagingOffsetAlign = 256;

struct GemmStaging {
  // Row pitches in elements: the stored row length where nothing is staged.
  int64_t a_pitch = 0, b_pitch = 0, c_pitch = 0;
  bool stage_a = false, stage_b = false, stage_c = false;
  int64_t scratch_bytes = 0;
  bool any() const { return stage_a || stage_b || stage_c; }
};

inline int64_t RoundUp(int64_t x, int64_t to) { return (x + to - 1) / to * to; }

// For c [m, n] = op(a) @ op(b), a stored [m, k] ([k, m] transposed), b
// stored [k, n] ([n, k] transposed), elements of ab_bytes (a, b) and c_bytes.
inline GemmStaging PlanGemmStaging(int64_t m, int64_t n, int64_t k, bool transpose_a, bool transpose_b,
                                   int64_t ab_bytes, int64_t c_bytes, double min_flops = kStagingMinFlops) {
  GemmStaging s;
  const int64_t a_rows = transpose_a ? k : m, a_cols = transpose_a ? m : k;
  const int64_t b_rows = transpose_b ? n : k, b_cols = transpose_b ? k : n;
  s.a_pitch = a_cols;
  s.b_pitch = b_cols;
  s.c_pitch = n;
  if (m <= 0 || n <= 0 || k <= 0 || ab_bytes <= 0 || c_bytes <= 0) return s;
  if (2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) < min_flops) return s;
  // A pitch of whole 16-byte units; 16 is a multiple of every element size here (2, 4, 8).
  auto plan = [&](int64_t rows, int64_t cols, int64_t bytes, int64_t* pitch, bool* stage) {
    if ((cols * bytes) % kPitchAlignBytes == 0) return;
    *stage = true;
    *pitch = RoundUp(cols * bytes, kPitchAlignBytes) / bytes;
    s.scratch_bytes += RoundUp(rows * *pitch * bytes, kStagingOffsetAlign);
  };
  plan(a_rows, a_cols, ab_bytes, &s.a_pitch, &s.stage_a);
  plan(b_rows, b_cols, ab_bytes, &s.b_pitch, &s.stage_b);
  plan(m, n, c_bytes, &s.c_pitch, &s.stage_c);
  return s;
}

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_GEMM_STAGING_H_
