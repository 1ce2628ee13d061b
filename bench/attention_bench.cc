// bench/attention_bench: Strata's tensor-core flash attention
// (kernels/cuda/flash_attention.h) on one GPU, forward and gradient apart,
// on WMMA (STRATA_MMA_ATTENTION=0) and on mma.sync (the default since
// 2026-11-29; with 32-row warps, and with 16-row ones as "mma16":
// STRATA_MMA_WIDE_WARPS=0), each set by the benchmark itself,
// at a GPT-2 124M layer's shape by default (batch 8, 12 heads of 64, 1024
// tokens, causal, bf16), in both head layouts ([B, H, T, D] and the
// [B, T, H, D] of passes/attention_layout). bench/attention.py runs it beside
// PyTorch's F.scaled_dot_product_attention on the same GPU and prints the
// ratios.
//
// Each kernel runs --iters back-to-back calls between two CUDA events after
// --warmup calls; the measurement repeats --repeats times (median and
// spread). FLOPs counted as FlashAttention's papers count them: forward 4 B H
// T^2 D (two GEMMs), halved when causal; the gradient 2.5 times the forward
// (five GEMMs to the forward's two).
//
//   bash .device/run.sh attention_bench [--batch=8 --heads=12 --seq=1024 --head_dim=64 --causal=true]
//
// Prints one "RESULT kernel=... layout=... ms=... tflops=..." line per kernel
// and layout; exits 1 with one "error: ..." line on stderr when there is no
// GPU or a call fails.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/cuda_bench_util.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/flash_attention.h"

ABSL_FLAG(int64_t, batch, 8, "batch size");
ABSL_FLAG(int64_t, heads, 12, "heads");
ABSL_FLAG(int64_t, seq, 1024, "tokens (T)");
ABSL_FLAG(int64_t, head_dim, 64, "head size (D): 32, 64 or 128");
ABSL_FLAG(bool, causal, true, "causal mask");
ABSL_FLAG(int, warmup, 5, "untimed calls before each timing");
ABSL_FLAG(int, iters, 20, "timed back-to-back calls");
ABSL_FLAG(int, repeats, 3, "timings; the median and spread are over these");

namespace {

using strata::bench::Check;
using strata::bench::DeviceBuffer;
using strata::bench::Fail;

__nv_bfloat16* RandomBf16(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<__nv_bfloat16> host(n);
  for (auto& x : host) x = __float2bfloat16(normal(rng));
  __nv_bfloat16* d = DeviceBuffer<__nv_bfloat16>(n);
  Check(cudaMemcpy(d, host.data(), n * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

// Median and range of `repeats` timings of `iters` calls of f, ms a call.
template <typename F>
void Time(const char* kernel, const char* layout, double flops, F f) {
  const int warmup = absl::GetFlag(FLAGS_warmup), iters = absl::GetFlag(FLAGS_iters);
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> ms;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    for (int i = 0; i < warmup; ++i) Check(f(), kernel);
    Check(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) Check(f(), kernel);
    Check(cudaEventRecord(stop), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), kernel);
    float total = 0;
    Check(cudaEventElapsedTime(&total, start, stop), "cudaEventElapsedTime");
    ms.push_back(total / iters);
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  std::printf("%-10s %-5s %9.4f ms [%.4f-%.4f] %8.1f TFLOP/s\n", kernel, layout, median, ms.front(), ms.back(),
              flops / (median * 1e-3) / 1e12);
  std::printf("RESULT kernel=%s layout=%s ms=%.5f ms_min=%.5f ms_max=%.5f tflops=%.2f\n", kernel, layout, median,
              ms.front(), ms.back(), flops / (median * 1e-3) / 1e12);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  strata::bench::BenchName() = "attention_bench";
  const int64_t B = absl::GetFlag(FLAGS_batch), H = absl::GetFlag(FLAGS_heads), T = absl::GetFlag(FLAGS_seq),
                D = absl::GetFlag(FLAGS_head_dim);
  const bool causal = absl::GetFlag(FLAGS_causal);
  if (B < 1 || H < 1 || T < 1 || !strata::cuda::FlashTensorCoreHeadDim(D)) {
    Fail("--batch, --heads and --seq must be positive and --head_dim 32, 64 or 128");
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) Fail("no CUDA device");
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const int64_t n = B * H * T * D, rows = B * H * T;
  __nv_bfloat16 *q = RandomBf16(n, 1), *k = RandomBf16(n, 2), *v = RandomBf16(n, 3), *dy = RandomBf16(n, 4);
  __nv_bfloat16 *y = DeviceBuffer<__nv_bfloat16>(n), *dq = DeviceBuffer<__nv_bfloat16>(n),
                *dk = DeviceBuffer<__nv_bfloat16>(n), *dv = DeviceBuffer<__nv_bfloat16>(n);
  float *lse = DeviceBuffer<float>(rows), *di = DeviceBuffer<float>(rows);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const double forward_flops = 4.0 * B * H * T * T * D * (causal ? 0.5 : 1.0);
  std::printf("attention_bench: %s, batch %lld, %lld heads of %lld, %lld tokens, %s, bf16\n", prop.name,
              static_cast<long long>(B), static_cast<long long>(H), static_cast<long long>(D),
              static_cast<long long>(T), causal ? "causal" : "not causal");
  // The WMMA kernels first, both layouts; then the mma.sync ones (the
  // default since they ran on an H200 on 2026-11-29; last because they had
  // not run on a GPU when this was written, so a fault there loses only
  // their rows).
  // The mma.sync kernels twice: 32-row warps (the default) and 16-row ones
  // (STRATA_MMA_WIDE_WARPS=0; the forward and dq differ, dk/dv do not);
  // then a third time with the gradient on stored score gradients
  // (STRATA_STORED_SCORE_GRADS=1; the forward is the default's), last as
  // written without a GPU.
  const struct {
    bool mma, wide, stored;
    const char *fwd, *bwd;
  } variants[] = {{false, true, false, "flash_fwd", "flash_bwd"},
                  {true, true, false, "mma_fwd", "mma_bwd"},
                  {true, false, false, "mma16_fwd", "mma16_bwd"},
                  {true, true, true, "stored_fwd", "stored_bwd"}};
  for (const auto& variant : variants) {
    strata::cuda::MmaFlashAttention().store(variant.mma);
    strata::cuda::MmaWideWarps().store(variant.wide);
    strata::cuda::StoredScoreGrads().store(variant.stored);
    const int64_t ds_words = strata::cuda::FlashScoreGradWords(B * H, T, D, causal);
    if (variant.stored && ds_words == 0) {
      std::printf("attention_bench: the score gradients (%lld heads of %lld tokens) exceed their budget: not timed\n",
                  static_cast<long long>(B * H), static_cast<long long>(T));
      continue;
    }
    uint32_t* ds = ds_words > 0 ? DeviceBuffer<uint32_t>(ds_words) : nullptr;
    for (const bool bthd : {false, true}) {
      strata::cuda::HeadLayout layout;
      layout.H = H;
      layout.bthd = bthd;
      const char* name = bthd ? "bthd" : "bhtd";
      Time(variant.fwd, name, forward_flops, [&] {
        return strata::cuda::LaunchFlashAttention(y, lse, q, k, v, B * H, T, D, scale, causal, nullptr, layout);
      });
      Time(variant.bwd, name, 2.5 * forward_flops, [&] {
        return strata::cuda::LaunchFlashAttentionGrad(dq, dk, dv, q, k, v, y, lse, dy, nullptr, di, B * H, T, D, scale,
                                                      causal, nullptr, layout, ds);
      });
    }
  }
  return 0;
}
