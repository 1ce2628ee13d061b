#ifndef STRATA_KERNELS_CUDA_NN_H_
#define STRATA_KERNELS_CUDA_NN_H_

// softmax, log_softmax and their grads, layer_norm and its grad, dropout,
// embedding and its grad on the GPU, with the numbers of kernels/cpu/
// softmax.cc, layer_norm.cc, dropout.cc and embedding.cc. Deterministic: no
// float atomics; every sum has a fixed order. Asynchronous on `stream`.
// Overloads for float and double.
//
// - softmax family: one block per lane (the K elements of one (m, n) of x
//   viewed as [M, K, N]); the max, and the double sum, by a fixed tree. The
//   CPU sums in index order, so the sums can differ in their last bits, and
//   exp is CUDA's (2 ulp in float, 1 in double) not glibc's.
// - layer_norm(_grad): eight threads per row, thread k adding the CPU's lane k
//   (kernels/cpu/layer_norm.cc's LaneSum) in its order, so every double and
//   every output equals the CPU's bit for bit; dgamma/dbeta summed per block
//   of nn_kernels::LayerNormGradRowsPerBlock rows, then over blocks, as the CPU.
//   For speed every serial sum loads its terms in batches ahead of adding
//   them in that same order, and the partial dgamma/dbeta sums one thread a
//   column 32 rows ahead.
// - dropout: runtime/philox.h's arithmetic on the device: the CPU's mask.
// - embedding_grad: a sort of (id, position) (a bitonic sort of the unique
//   keys id * n + position, so the result does not depend on the sort), then
//   one block per id adds its positions' rows in position order: the CPU's
//   order, the CPU's bits.
//
// Ids outside [0, V): the CPU refuses them before computing; the ids live on
// the device and are not read on the host, so embedding writes NaN in that
// position's output row, and embedding_grad fills all of dtable with NaN (as
// kernels/cuda/losses.h does for a bad label).

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "kernels/env_switch.h"
#include "runtime/float16.h"

namespace strata {
namespace cuda {

enum class SoftmaxMode : int { kSoftmax = 0, kLogSoftmax = 1, kSoftmaxGrad = 2, kLogSoftmaxGrad = 3 };

// out = f(a[, b]) along K of [M, K, N] (b: dy for the grads, else null).
cudaError_t LaunchSoftmax(SoftmaxMode mode, float* out, const float* a, const float* b, int64_t M, int64_t K, int64_t N,
                          cudaStream_t stream);
cudaError_t LaunchSoftmax(SoftmaxMode mode, double* out, const double* a, const double* b, int64_t M, int64_t K,
                          int64_t N, cudaStream_t stream);

// Whether layer_norm and layer_norm_grad keep an F32 row of at most 768
// values in registers (each value loaded once; the same bits as the kernels
// that read the row again for each sum, nn.cu). Written 2026-11-29 (session
// 38) without a GPU and checked bit for bit in nn_emulation_test; fewer
// blocks an SM than the kernels it replaces (the registers the rows take),
// so off until a GPU has timed it: STRATA_LN_ROW_REGISTERS=1 turns it on
// for a process (tools/gpu_check.sh times GPT-2 with it).
inline std::atomic<bool>& LayerNormRowsInRegisters() {
  static std::atomic<bool> on{EnvSwitch("STRATA_LN_ROW_REGISTERS", /*default_on=*/false)};
  return on;
}

// Sets LayerNormRowsInRegisters() for its lifetime (tests), then restores it.
class ScopedLayerNormRowsInRegisters : public ScopedSwitch {
 public:
  explicit ScopedLayerNormRowsInRegisters(bool on) : ScopedSwitch(LayerNormRowsInRegisters(), on) {}
};

// y [R, D] = layer_norm(x) * gamma + beta.
cudaError_t LaunchLayerNorm(float* y, const float* x, const float* gamma, const float* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream);
cudaError_t LaunchLayerNorm(double* y, const double* x, const double* gamma, const double* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream);
// An F32 x with y stored in BF16 / F16 (passes/fold_casts): each value the
// float kernel's, rounded as the cast kernel rounds it.
cudaError_t LaunchLayerNorm(bfloat16* y, const float* x, const float* gamma, const float* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream);
cudaError_t LaunchLayerNorm(float16* y, const float* x, const float* gamma, const float* beta, int64_t R, int64_t D,
                            double epsilon, cudaStream_t stream);

// Doubles of scratch LaunchLayerNormGrad needs for x [R, D]. With a
// residual (x's type; null for none) dx is residual + the layer norm's dx,
// summed in x's type as add_n sums them.
int64_t LayerNormGradScratchDoubles(int64_t R, int64_t D);
cudaError_t LaunchLayerNormGrad(float* dx, float* dgamma, float* dbeta, const float* x, const float* gamma,
                                const float* dy, const float* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormGrad(double* dx, double* dgamma, double* dbeta, const double* x, const double* gamma,
                                const double* dy, const double* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream);
// An F32 x with dy stored in BF16 / F16, read widened (exact).
cudaError_t LaunchLayerNormGrad(float* dx, float* dgamma, float* dbeta, const float* x, const float* gamma,
                                const bfloat16* dy, const float* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormGrad(float* dx, float* dgamma, float* dbeta, const float* x, const float* gamma,
                                const float16* dy, const float* residual, int64_t R, int64_t D, double epsilon,
                                double* scratch, cudaStream_t stream);
// The same (dy F32, BF16 or F16) with dx also stored in dx_low [R, D] in
// BF16 / F16, each value rounded as the cast kernel rounds it (layer_norm_grad's
// out_dtype, passes/fold_casts: the cast of dx for the 16-bit GEMMs).
cudaError_t LaunchLayerNormGrad(float* dx, bfloat16* dx_low, float* dgamma, float* dbeta, const float* x,
                                const float* gamma, const float* dy, const float* residual, int64_t R, int64_t D,
                                double epsilon, double* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormGrad(float* dx, bfloat16* dx_low, float* dgamma, float* dbeta, const float* x,
                                const float* gamma, const bfloat16* dy, const float* residual, int64_t R, int64_t D,
                                double epsilon, double* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormGrad(float* dx, bfloat16* dx_low, float* dgamma, float* dbeta, const float* x,
                                const float* gamma, const float16* dy, const float* residual, int64_t R, int64_t D,
                                double epsilon, double* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormGrad(float* dx, float16* dx_low, float* dgamma, float* dbeta, const float* x,
                                const float* gamma, const float* dy, const float* residual, int64_t R, int64_t D,
                                double epsilon, double* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormGrad(float* dx, float16* dx_low, float* dgamma, float* dbeta, const float* x,
                                const float* gamma, const bfloat16* dy, const float* residual, int64_t R, int64_t D,
                                double epsilon, double* scratch, cudaStream_t stream);
cudaError_t LaunchLayerNormGrad(float* dx, float16* dx_low, float* dgamma, float* dbeta, const float* x,
                                const float* gamma, const float16* dy, const float* residual, int64_t R, int64_t D,
                                double epsilon, double* scratch, cudaStream_t stream);

// Where dropout's step and first linear index come from: `device`, when
// set, points at {step, first sample} in device memory (the executor's
// counters, read when the kernel runs, so a CUDA graph replays with the
// current step's), and base = first sample * per_sample; else `step` and
// `base` as given.
struct DropoutCounters {
  const int64_t* device = nullptr;
  uint64_t step = 0;
  uint64_t base = 0;
  uint64_t per_sample = 1;
};

// out[i] = in[i] * scale if PhiloxUniform(lane (base + i) % 4 of
// PhiloxUniformBits(key, step, (base + i) / 4)) >= p, else 0; i < n.
cudaError_t LaunchDropout(float* out, const float* in, int64_t n, uint64_t key, const DropoutCounters& counters,
                          double p, float scale, cudaStream_t stream);
cudaError_t LaunchDropout(double* out, const double* in, int64_t n, uint64_t key, const DropoutCounters& counters,
                          double p, double scale, cudaStream_t stream);

// y [n, D] = table [V, D] rows at ids [n].
cudaError_t LaunchEmbedding(float* y, const float* table, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                            cudaStream_t stream);
cudaError_t LaunchEmbedding(double* y, const double* table, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                            cudaStream_t stream);

// int64 keys of scratch LaunchEmbeddingGrad needs for n ids.
int64_t EmbeddingGradScratchKeys(int64_t n);
// dtable [V, D] = sum over positions i (in order) of dy[i] into row ids[i].
cudaError_t LaunchEmbeddingGrad(float* dtable, const float* dy, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                                int64_t* scratch, cudaStream_t stream);
cudaError_t LaunchEmbeddingGrad(double* dtable, const double* dy, const int64_t* ids, int64_t n, int64_t V, int64_t D,
                                int64_t* scratch, cudaStream_t stream);

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_NN_H_
