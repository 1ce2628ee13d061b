// bench/layer_norm_bench: Strata's layer_norm and layer_norm_grad kernels
// (kernels/cuda/nn.h) on one GPU, at GPT-2 124M's shape by default (8192
// rows of 768) and as GPT-2's mixed-precision step calls them: the forward
// from an F32 x to a BF16 y, the gradient from an F32 x and a BF16 dy with
// the residual, writing dx and its BF16 copy (dx_low). Each kernel twice:
// the rows read again for each sum (the default) and kept in registers
// (STRATA_LN_ROW_REGISTERS=1, written 2026-11-29 without a GPU), set by the
// benchmark itself, against the bytes each call must move at least (every
// input read once, every output written once) at the GPU's memory
// bandwidth, measured here by a device-to-device copy of the same bytes.
// Both variants' outputs are compared bit for bit (they must be equal).
//
// Each kernel runs --iters back-to-back calls between two CUDA events after
// --warmup calls; the measurement repeats --repeats times (median and
// spread).
//
//   bash .device/run.sh layer_norm_bench [--rows=8192 --cols=768]
//
// Prints one "RESULT kernel=... rows_in_registers=... us=... of_copy=..."
// line per kernel and variant, where of_copy is the time a copy of the
// kernel's bytes takes over the kernel's (1.0: as fast as memory allows);
// exits 1 with one "error: ..." line on stderr when there is no GPU, a call
// fails or the variants' outputs differ.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/cuda_bench_util.h"
#include "kernels/cuda/nn.h"
#include "runtime/float16.h"

ABSL_FLAG(int64_t, rows, 8192, "rows (R): batch x tokens");
ABSL_FLAG(int64_t, cols, 768, "row length (D): d_model");
ABSL_FLAG(int, warmup, 5, "untimed calls before each timing");
ABSL_FLAG(int, iters, 50, "timed back-to-back calls");
ABSL_FLAG(int, repeats, 5, "timings; the median and spread are over these");

namespace {

using strata::bfloat16;

using strata::bench::Check;
using strata::bench::DeviceBuffer;
using strata::bench::Fail;

template <typename T>
T* Upload(const std::vector<T>& host) {
  T* d = DeviceBuffer<T>(static_cast<int64_t>(host.size()));
  Check(cudaMemcpy(d, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy");
  return d;
}

std::vector<float> Normal(int64_t n, uint32_t seed, float mean, float std) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(mean, std);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<bfloat16> ToBf16(const std::vector<float>& v) {
  std::vector<bfloat16> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = strata::ToBfloat16(v[i]);
  return out;
}

// The device bytes of a buffer, for comparing the variants' outputs.
std::vector<unsigned char> Download(const void* d, int64_t bytes) {
  std::vector<unsigned char> host(bytes);
  Check(cudaMemcpy(host.data(), d, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

// Median and range of `repeats` timings of `iters` calls of f, us a call.
template <typename F>
std::vector<double> Time(const char* what, F f) {
  const int warmup = absl::GetFlag(FLAGS_warmup), iters = absl::GetFlag(FLAGS_iters);
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "cudaEventCreate");
  Check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<double> us;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    for (int i = 0; i < warmup; ++i) Check(f(), what);
    Check(cudaEventRecord(start), "cudaEventRecord");
    for (int i = 0; i < iters; ++i) Check(f(), what);
    Check(cudaEventRecord(stop), "cudaEventRecord");
    Check(cudaEventSynchronize(stop), what);
    float total = 0;
    Check(cudaEventElapsedTime(&total, start, stop), "cudaEventElapsedTime");
    us.push_back(1e3 * total / iters);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(us.begin(), us.end());
  return us;
}

// A device-to-device copy of `bytes` (read once, written once: `bytes` moved
// in all, as 2 x bytes / 2), us a call: the floor a kernel moving `bytes`
// meets.
double CopyMicros(int64_t bytes) {
  const int64_t half = bytes / 2;
  char* src = DeviceBuffer<char>(half);
  char* dst = DeviceBuffer<char>(half);
  Check(cudaMemset(src, 1, half), "cudaMemset");
  const std::vector<double> us =
      Time("copy", [&] { return cudaMemcpyAsync(dst, src, half, cudaMemcpyDeviceToDevice); });
  cudaFree(src);
  cudaFree(dst);
  return us[us.size() / 2];
}

void Report(const char* kernel, bool registers, const std::vector<double>& us, int64_t bytes) {
  const double median = us[us.size() / 2], copy = CopyMicros(bytes);
  std::printf("%-15s %-9s %8.2f us [%.2f-%.2f]  %6.1f MB moved at least, a copy of them %6.2f us (%.2fx)\n", kernel,
              registers ? "registers" : "reread", median, us.front(), us.back(), bytes / 1e6, copy, copy / median);
  std::printf(
      "RESULT kernel=%s rows_in_registers=%d us=%.3f us_min=%.3f us_max=%.3f bytes=%lld copy_us=%.3f "
      "of_copy=%.3f\n",
      kernel, registers ? 1 : 0, median, us.front(), us.back(), static_cast<long long>(bytes), copy, copy / median);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  strata::bench::BenchName() = "layer_norm_bench";
  const int64_t R = absl::GetFlag(FLAGS_rows), D = absl::GetFlag(FLAGS_cols);
  if (R < 1 || D < 1) Fail("--rows and --cols must be positive");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) Fail("no CUDA device");
  cudaDeviceProp prop;
  Check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf("layer_norm_bench: %s, %lld rows of %lld, F32 x, BF16 y and dy, the residual, dx_low BF16\n", prop.name,
              static_cast<long long>(R), static_cast<long long>(D));
  const int64_t n = R * D;
  const double epsilon = 1e-5;
  float* x = Upload(Normal(n, 1, 0.1f, 1.0f));
  float* gamma = Upload(Normal(D, 2, 1.0f, 0.1f));
  float* beta = Upload(Normal(D, 3, 0.0f, 0.1f));
  bfloat16* dy = Upload(ToBf16(Normal(n, 4, 0.0f, 1.0f)));
  float* residual = Upload(Normal(n, 5, 0.0f, 1.0f));
  bfloat16* y = DeviceBuffer<bfloat16>(n);
  float* dx = DeviceBuffer<float>(n);
  bfloat16* dx_low = DeviceBuffer<bfloat16>(n);
  float* dgamma = DeviceBuffer<float>(D);
  float* dbeta = DeviceBuffer<float>(D);
  double* scratch = DeviceBuffer<double>(strata::cuda::LayerNormGradScratchDoubles(R, D));
  const int64_t forward_bytes = n * (4 + 2) + 2 * D * 4;
  // x, dy, the residual read; dx, dx_low written; gamma read, dgamma and dbeta written.
  const int64_t grad_bytes = n * (4 + 2 + 4 + 4 + 2) + 3 * D * 4;
  std::vector<std::vector<unsigned char>> outputs[2];
  for (const bool registers : {false, true}) {
    strata::cuda::LayerNormRowsInRegisters().store(registers);
    const auto forward = [&] { return strata::cuda::LaunchLayerNorm(y, x, gamma, beta, R, D, epsilon, nullptr); };
    const auto grad = [&] {
      return strata::cuda::LaunchLayerNormGrad(dx, dx_low, dgamma, dbeta, x, gamma, dy, residual, R, D, epsilon,
                                               scratch, nullptr);
    };
    Report("layer_norm", registers, Time("layer_norm", forward), forward_bytes);
    Report("layer_norm_grad", registers, Time("layer_norm_grad", grad), grad_bytes);
    Check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    outputs[registers] = {Download(y, n * 2), Download(dx, n * 4), Download(dx_low, n * 2), Download(dgamma, D * 4),
                          Download(dbeta, D * 4)};
  }
  const char* names[] = {"y", "dx", "dx_low", "dgamma", "dbeta"};
  for (int i = 0; i < 5; ++i) {
    if (outputs[0][i] != outputs[1][i]) Fail(absl::StrCat("the two variants' ", names[i], " differ"));
  }
  std::printf("outputs: the same bits both ways (y, dx, dx_low, dgamma, dbeta)\n");
  return 0;
}
