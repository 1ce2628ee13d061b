#ifndef STRATA_KERNELS_CPU_ONEDNN_GEMM_H_
#define STRATA_KERNELS_CPU_ONEDNN_GEMM_H_

// bfloat16 GEMMs on the CPU through oneDNN's matmul primitive (bf16
// operands, float accumulation and output), for mixed precision's matmuls:
// the products of two bf16 values are exact in float, so the result is the
// float GEMM of the widened operands up to the order of the additions, at
// AVX512_BF16 (or AMX) speed and without the widened copies. PyTorch's CPU
// autocast runs bf16 matmul through the same library. One more difference:
// the bf16 dot-product instructions treat denormal operands as zero and
// flush denormal results (bf16 values below 1.2e-38; float would keep them).
//
// Threads: each call runs on the calling thread (its OpenMP team capped at
// one thread); GemmOrScale below cuts a large GEMM into panels over
// Strata's pool, as gemm.h does for OpenBLAS. Primitives are made once per
// shape and kept for the process; each thread passes its own scratchpad
// (up to about 1.4 MiB at GPT-2 124M's shapes, kept by the thread and
// outside the allocator's counters like OpenBLAS's own buffers; a
// primitive asking more than kMaxScratchpadBytes is refused), so one
// primitive runs on several threads at once.

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/float16.h"

namespace strata {

// STRATA_ONEDNN_BF16=0 turns the native bf16 GEMMs off (the float32 GEMMs
// on widened copies, as before oneDNN): read once; tests set it with
// ScopedSwitch before they build kernels or plans.
std::atomic<bool>& OnednnBf16Switch();

// Whether bf16 matmuls run natively: the switch is on and the CPU has
// AVX512_BF16 (or AMX) for oneDNN's bf16 kernels. Kernels and
// the memory plan's workspace functions ask it when they are made, so both
// see the same path.
bool NativeBf16Gemm();

// STRATA_ONEDNN_F32=0 keeps float32 GEMMs on OpenBLAS (gemm.h).
std::atomic<bool>& OnednnF32Switch();

// Whether gemm.h's float32 GEMMs above a size go to oneDNN: the switch is
// on and the CPU has AVX-512 for oneDNN's f32 kernels.
bool OnednnF32Gemm();

// c[m, n] = op(a)[m, k] @ op(b)[k, n] + beta * c[m, n], row-major, on the
// calling thread (beta 0: c is not read). m, n, k > 0. Runs wherever
// oneDNN has the primitive (bf16: AVX-512 and up, emulated without
// AVX512_BF16; f32: any CPU); otherwise an Unimplemented error, and any
// other oneDNN failure an Internal one, naming the shape.
absl::Status OnednnGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, const bfloat16* a,
                        int64_t lda, const bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same for float32 operands, c = alpha * op(a) @ op(b) + beta * c.
absl::Status OnednnGemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                        int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The scratchpad a thread keeps for a GEMM (outside the memory plan; a
// primitive asking more than kMaxScratchpadBytes is refused: OnednnGemm
// returns ResourceExhausted naming it, and GemmOrScale then runs that
// panel on widened float copies, noted once through
// NoteCpuKernelFallback). For tests and diagnostics.
inline constexpr size_t kMaxScratchpadBytes = size_t{8} << 20;
// The limit primitives made from now on are held to (kMaxScratchpadBytes;
// tests lower it). A primitive is made once per GEMM, its refusal kept too.
std::atomic<size_t>& MaxScratchpadBytes();
absl::StatusOr<size_t> OnednnScratchpadBytes(bool f32, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                              int64_t lda, int64_t ldb, int64_t ldc, float alpha, float beta);

// OnednnGemm over Strata's pool in panels of C (gemm.h's cut), tolerating
// empty sizes as gemm.h's GemmOrScale does (k == 0: c = beta * c).
absl::Status GemmOrScale(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const bfloat16* a, int64_t lda, const bfloat16* b, int64_t ldb, float beta, float* c,
                         int64_t ldc);

}  // namespace strata

#endif  // STRATA_KERNELS_CPU_ONEDNN_GEMM_H_
