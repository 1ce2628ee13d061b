// bench/gemm_bench: Strata's GPU GEMM against the bare cuBLASLt call, on
// every matmul of a GPT-2 124M training step at batch 8 x 1024 tokens.
//
// Strata's side is LtGemm::Matmul as the matmul kernel calls it (plans cached
// per shape, so after the first call it is a hash lookup and cublasLtMatmul).
// The baseline is the very same cublasLtMatmul call with its descriptors,
// preference and algorithm prepared once outside the timed loop: the same
// heuristic query, the same workspace size, the same operands. Each side runs
// N back-to-back calls between two CUDA events after a warm-up; N is at least
// --min_iters and enough for --min_ms. The whole measurement repeats
// --repeats times; the two sides alternate which goes first.
//
//   TFLOP/s = 2 M N K / seconds per GEMM
//   ratio   = baseline time / Strata time (Strata's speed as a share of the
//             baseline's); the goal is >= 95%
//
// Before timing, each shape is validated: Strata's result against a CPU
// reference (in double) at 128 entries, within 1e-3 (f32) or 2e-2 (bf16) of
// the largest |c| among them; and Strata's bits against the baseline's (the
// same algorithm gives the same bits; a difference is reported, not fatal).
//
//   bash .device/run.sh gemm_bench [--dtype=f32|bf16|both] [--repeats=3]
//
// Exits 1 with one "error: ..." line on stderr when there is no GPU or a
// call or validation fails.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "kernels/cuda/cuda_info.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kept_block_allocator.h"

ABSL_FLAG(std::string, dtype, "both", "f32 (FP32, no TF32), bf16 (bf16 in and out, FP32 accumulate) or both");
ABSL_FLAG(int, repeats, 3, "how many times the whole measurement runs; the spread is over these");
ABSL_FLAG(int, warmup, 5, "untimed calls of each side before each timing");
ABSL_FLAG(int, min_iters, 20, "each timing runs at least this many back-to-back calls");
ABSL_FLAG(double, min_ms, 20, "... and enough of them to last at least this many milliseconds");
ABSL_FLAG(std::string, shapes, "", "comma-separated shape names to run (default: all), e.g. qkv.fwd,lm_head.dw");
ABSL_FLAG(bool, epilogues, false,
          "bf16 only: also time the forward linears with their fused epilogues as the plan runs them (matmul_bias "
          "and, for mlp.fc, matmul_bias_gelu with a bf16 aux and with a float one, each storing bf16 beside a float "
          "bias) and the weight "
          "gradients with the bias gradient fused (matmul_bias_grad_b), against the plain GEMM of the same shape");
ABSL_FLAG(int64_t, vocab, 50304,
          "the LM head's vocabulary: 50304, the head passes/pad_vocab makes of GPT-2's 50257 (rows of 16-byte "
          "multiples, the loss reading the first 50257) and so the plan's GEMMs; 50257 for the unpadded head");
ABSL_FLAG(bool, staging, true,
          "Strata's side stages operands whose rows are not 16-byte multiples through padded scratch, as "
          "its kernels on a CudaDevice do (kernels/gemm_staging.h); false: the operands as they are");

namespace strata {
namespace bench {
namespace {

constexpr double kGoal = 0.95;

// ---------------------------------------------------------------- shapes

// One GEMM: c[m, n] = op(a)[m, k] @ op(b)[k, n], row-major, as LtGemm takes it.
struct GemmShape {
  std::string name;
  int64_t m, n, k;
  bool transpose_a, transpose_b;
  int per_step;  // how many times one training step runs it

  double flops() const { return 2.0 * m * n * k; }
};

// GPT-2 124M (HF layout): each block's linears store W as [in, out] and run
// y = x @ W; the LM head is the token embedding wte [vocab, d_model], tied,
// so logits = x @ wte^T. Backward of y = x @ W: dx = dy @ W^T, dW = x^T @ dy.
// Attention's batched GEMMs (q k^T, p v) are not here.
std::vector<GemmShape> Gpt2TrainingShapes() {
  constexpr int64_t kRows = 8 * 1024;  // batch 8 x 1024 tokens
  constexpr int64_t kModel = 768;
  const int64_t kVocab = absl::GetFlag(FLAGS_vocab);
  constexpr int kLayers = 12;
  std::vector<GemmShape> shapes;
  auto linear = [&](const std::string& name, int64_t in, int64_t out) {
    shapes.push_back({name + ".fwd", kRows, out, in, false, false, kLayers});  // y = x @ W
    shapes.push_back({name + ".dx", kRows, in, out, false, true, kLayers});    // dx = dy @ W^T
    shapes.push_back({name + ".dw", in, out, kRows, true, false, kLayers});    // dW = x^T @ dy
  };
  linear("qkv", kModel, 3 * kModel);
  linear("attn.proj", kModel, kModel);
  linear("mlp.fc", kModel, 4 * kModel);
  linear("mlp.proj", 4 * kModel, kModel);
  shapes.push_back({"lm_head.fwd", kRows, kVocab, kModel, false, true, 1});  // logits = x @ wte^T
  shapes.push_back({"lm_head.dx", kRows, kModel, kVocab, false, false, 1});  // dx = dlogits @ wte
  shapes.push_back({"lm_head.dw", kVocab, kModel, kRows, true, false, 1});   // dwte = dlogits^T @ x
  return shapes;
}

// Elements of the stored operands (a is [m, k] or [k, m], b [k, n] or [n, k]).
int64_t ElementsA(const GemmShape& s) { return s.m * s.k; }
int64_t ElementsB(const GemmShape& s) { return s.k * s.n; }
int64_t ElementsC(const GemmShape& s) { return s.m * s.n; }

// ---------------------------------------------------------------- errors

absl::Status CudaStatus(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ", cudaGetErrorString(error)));
}

absl::Status LtStatus(cublasStatus_t status, const std::string& what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLASLt ", what, ": ", cublasLtGetStatusString(status)));
}

#define BENCH_RETURN_IF_ERROR(expr)              \
  do {                                           \
    const absl::Status bench_status = (expr);    \
    if (!bench_status.ok()) return bench_status; \
  } while (false)

// ---------------------------------------------------------------- types

template <typename T>
struct TypeInfo;
template <>
struct TypeInfo<float> {
  static constexpr const char* kName = "f32";
  static constexpr const char* kDescription = "FP32 in and out, FP32 products and sums (CUBLAS_COMPUTE_32F, no TF32)";
  static constexpr cudaDataType_t kCuda = CUDA_R_32F;
  static constexpr double kTolerance = 1e-3;  // of the largest |c| sampled; a wrong answer is off by O(1)
  static float FromFloat(float f) { return f; }
  static double ToDouble(float v) { return v; }
};
template <>
struct TypeInfo<__nv_bfloat16> {
  static constexpr const char* kName = "bf16";
  static constexpr const char* kDescription = "bf16 in and out, FP32 accumulate (CUBLAS_COMPUTE_32F, scale CUDA_R_32F)";
  static constexpr cudaDataType_t kCuda = CUDA_R_16BF;
  static constexpr double kTolerance = 2e-2;  // the bar for bf16
  static __nv_bfloat16 FromFloat(float f) { return __float2bfloat16(f); }
  static double ToDouble(__nv_bfloat16 v) { return __bfloat162float(v); }
};

// Inputs: multiples of 1/128 in [-1, 1), exact in bf16 (8 significant bits),
// so both types multiply the same numbers, and the CPU reference recomputes
// any element from its index without keeping a copy.
uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
float InputValue(uint64_t seed, int64_t index) {
  const int level = static_cast<int>(SplitMix64(seed << 40 ^ static_cast<uint64_t>(index)) >> 56) - 128;
  return static_cast<float>(level) / 128.0f;
}
constexpr uint64_t kSeedA = 1, kSeedB = 2;

// ---------------------------------------------------------------- device memory

class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, const std::string& what) {
    DeviceBuffer buffer;
    const cudaError_t error = cudaMalloc(&buffer.data_, std::max<size_t>(bytes, 1));
    if (error != cudaSuccess) {
      buffer.data_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("cudaMalloc of ", bytes >> 20, " MiB for ", what, ": ", cudaGetErrorString(error)));
    }
    return buffer;
  }
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    std::swap(data_, other.data_);
    return *this;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
};

template <typename T>
absl::Status FillDevice(T* device, int64_t count, uint64_t seed) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<T> host(static_cast<size_t>(std::min(count, kChunk)));
  for (int64_t start = 0; start < count; start += kChunk) {
    const int64_t length = std::min(kChunk, count - start);
    for (int64_t i = 0; i < length; ++i) host[i] = TypeInfo<T>::FromFloat(InputValue(seed, start + i));
    BENCH_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpy(device + start, host.data(), length * sizeof(T), cudaMemcpyHostToDevice), "upload of inputs"));
  }
  return absl::OkStatus();
}

// How many of the first `count` elements differ bit for bit.
template <typename T>
absl::StatusOr<int64_t> CountBitDifferences(const T* x, const T* y, int64_t count) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<T> host_x(static_cast<size_t>(std::min(count, kChunk))), host_y(host_x.size());
  int64_t differences = 0;
  for (int64_t start = 0; start < count; start += kChunk) {
    const int64_t length = std::min(kChunk, count - start);
    BENCH_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(host_x.data(), x + start, length * sizeof(T), cudaMemcpyDeviceToHost), "download of c"));
    BENCH_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(host_y.data(), y + start, length * sizeof(T), cudaMemcpyDeviceToHost), "download of c"));
    for (int64_t i = 0; i < length; ++i) differences += std::memcmp(&host_x[i], &host_y[i], sizeof(T)) != 0;
  }
  return differences;
}

// ---------------------------------------------------------------- the baseline

// The call LtGemm::Matmul makes, set up by hand once: row-major c = op(a) @
// op(b) is column-major c^T = op(b)^T @ op(a)^T, so cuBLASLt's A is our b,
// its B our a, and m and n swap. Same compute type, scale type, alignment
// preferences and workspace limit, so the heuristic makes the same choice.
class DirectLtMatmul {
 public:
  static absl::StatusOr<std::unique_ptr<DirectLtMatmul>> Create(cublasLtHandle_t handle, cudaDataType_t type,
                                                                const GemmShape& s, const void* a, const void* b,
                                                                void* c, void* workspace, size_t workspace_bytes) {
    std::unique_ptr<DirectLtMatmul> d(new DirectLtMatmul);
    d->handle_ = handle;
    d->a_ = a;
    d->b_ = b;
    d->c_ = c;
    d->workspace_ = workspace;
    d->workspace_bytes_ = workspace_bytes;
    BENCH_RETURN_IF_ERROR(LtStatus(cublasLtMatmulDescCreate(&d->desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc"));
    const cublasOperation_t op_a = s.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = s.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    BENCH_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulDescSetAttribute(d->desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)), "transa"));
    BENCH_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulDescSetAttribute(d->desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)), "transb"));
    // Column-major [rows, cols, ld] of the row-major stored matrices.
    auto layout = [type](cublasLtMatrixLayout_t* out, int64_t rows, int64_t cols) {
      return LtStatus(
          cublasLtMatrixLayoutCreate(out, type, static_cast<uint64_t>(cols), static_cast<uint64_t>(rows), cols),
          "layout");
    };
    BENCH_RETURN_IF_ERROR(s.transpose_b ? layout(&d->b_layout_, s.n, s.k) : layout(&d->b_layout_, s.k, s.n));
    BENCH_RETURN_IF_ERROR(s.transpose_a ? layout(&d->a_layout_, s.k, s.m) : layout(&d->a_layout_, s.m, s.k));
    BENCH_RETURN_IF_ERROR(layout(&d->c_layout_, s.m, s.n));

    cublasLtMatmulPreference_t preference = nullptr;
    BENCH_RETURN_IF_ERROR(LtStatus(cublasLtMatmulPreferenceCreate(&preference), "preference"));
    std::unique_ptr<cublasLtMatmulPreferenceOpaque_t, cublasStatus_t (*)(cublasLtMatmulPreference_t)> owner(
        preference, cublasLtMatmulPreferenceDestroy);
    const uint64_t max_workspace = workspace_bytes;
    BENCH_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &max_workspace, sizeof(max_workspace)),
                 "workspace preference"));
    const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, Alignment(b)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, Alignment(a)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, Alignment(c)},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, Alignment(c)},
    };
    for (const auto& [attribute, alignment] : alignments) {
      BENCH_RETURN_IF_ERROR(LtStatus(
          cublasLtMatmulPreferenceSetAttribute(preference, attribute, &alignment, sizeof(alignment)), "alignment"));
    }
    cublasLtMatmulHeuristicResult_t heuristic = {};
    int found = 0;
    BENCH_RETURN_IF_ERROR(
        LtStatus(cublasLtMatmulAlgoGetHeuristic(handle, d->desc_, d->b_layout_, d->a_layout_, d->c_layout_,
                                                d->c_layout_, preference, 1, &heuristic, &found),
                 "heuristic"));
    if (found == 0) return absl::UnimplementedError(absl::StrCat("cuBLASLt has no algorithm for ", s.name));
    d->algo_ = heuristic.algo;
    return d;
  }

  ~DirectLtMatmul() {
    if (c_layout_ != nullptr) cublasLtMatrixLayoutDestroy(c_layout_);
    if (a_layout_ != nullptr) cublasLtMatrixLayoutDestroy(a_layout_);
    if (b_layout_ != nullptr) cublasLtMatrixLayoutDestroy(b_layout_);
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  }

  cublasStatus_t Run(cudaStream_t stream) const {
    return cublasLtMatmul(handle_, desc_, &alpha_, b_, b_layout_, a_, a_layout_, &beta_, c_, c_layout_, c_, c_layout_,
                          &algo_, workspace_, workspace_bytes_, stream);
  }

 private:
  DirectLtMatmul() = default;
  // As LtGemm computes it: the largest power of two up to 256 dividing the address.
  static uint32_t Alignment(const void* p) {
    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    uint32_t alignment = 256;
    while (alignment > 1 && address % alignment != 0) alignment /= 2;
    return alignment;
  }

  cublasLtHandle_t handle_ = nullptr;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_layout_ = nullptr, b_layout_ = nullptr, c_layout_ = nullptr;
  cublasLtMatmulAlgo_t algo_ = {};
  const float alpha_ = 1.0f, beta_ = 0.0f;  // the scale type is FP32 for f32 and bf16 alike
  const void* a_ = nullptr;
  const void* b_ = nullptr;
  void* c_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
};

// ---------------------------------------------------------------- timing

// Milliseconds per call over `iterations` back-to-back calls of `call`
// (which returns absl::Status) between two events on `stream`.
template <typename Call>
absl::StatusOr<double> TimePerCallMs(const Call& call, int iterations, cudaStream_t stream, cudaEvent_t start,
                                     cudaEvent_t stop) {
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start, stream), "event record"));
  for (int i = 0; i < iterations; ++i) BENCH_RETURN_IF_ERROR(call());
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop, stream), "event record"));
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop), "GEMMs (at the event after them)"));
  float ms = 0;
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&ms, start, stop), "event elapsed time"));
  return static_cast<double>(ms) / iterations;
}

struct ShapeResult {
  GemmShape shape;
  int iterations = 0;
  bool same_bits = false;
  std::vector<double> strata_ms, baseline_ms;  // one per repeat
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double Tflops(double flops, double ms) { return flops / (ms * 1e-3) / 1e12; }

// ---------------------------------------------------------------- one dtype

class Runner {
 public:
  Runner(cudaStream_t stream, cudaEvent_t start, cudaEvent_t stop) : stream_(stream), start_(start), stop_(stop) {}

  template <typename T>
  absl::Status Run(const std::vector<GemmShape>& shapes, int repeats, std::vector<ShapeResult>* results);

 private:
  template <typename T>
  absl::Status Validate(const GemmShape& s, const T* c_strata, const T* c_baseline, bool* same_bits);

  cudaStream_t stream_;
  cudaEvent_t start_, stop_;
};

template <typename T>
absl::Status Runner::Validate(const GemmShape& s, const T* c_strata, const T* c_baseline, bool* same_bits) {
  // The CPU reference in double at the corners and 124 random entries.
  std::mt19937_64 rng(s.m * 31 + s.n * 17 + s.k);
  std::vector<std::pair<int64_t, int64_t>> samples = {{0, 0}, {0, s.n - 1}, {s.m - 1, 0}, {s.m - 1, s.n - 1}};
  while (samples.size() < 128) {
    samples.push_back({static_cast<int64_t>(rng() % s.m), static_cast<int64_t>(rng() % s.n)});
  }
  std::vector<double> reference, gpu;
  for (const auto& [i, j] : samples) {
    double sum = 0;
    for (int64_t p = 0; p < s.k; ++p) {
      const int64_t a_index = s.transpose_a ? p * s.m + i : i * s.k + p;
      const int64_t b_index = s.transpose_b ? j * s.k + p : p * s.n + j;
      sum += double(InputValue(kSeedA, a_index)) * double(InputValue(kSeedB, b_index));
    }
    reference.push_back(sum);
    T value;
    BENCH_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(&value, c_strata + i * s.n + j, sizeof(T), cudaMemcpyDeviceToHost), "download"));
    gpu.push_back(TypeInfo<T>::ToDouble(value));
  }
  double largest = 0;
  for (double r : reference) largest = std::max(largest, std::fabs(r));
  const double tolerance = TypeInfo<T>::kTolerance * largest;
  for (size_t e = 0; e < samples.size(); ++e) {
    const double error = std::fabs(gpu[e] - reference[e]);
    if (!(error <= tolerance)) {
      return absl::InternalError(absl::StrFormat(
          "validation: %s %s: Strata's c[%d, %d] = %.6g, CPU reference %.6g, tolerance %.3g (%g of the largest "
          "sampled |c|)",
          TypeInfo<T>::kName, s.name, samples[e].first, samples[e].second, gpu[e], reference[e], tolerance,
          TypeInfo<T>::kTolerance));
    }
  }
  absl::StatusOr<int64_t> differences = CountBitDifferences(c_strata, c_baseline, ElementsC(s));
  if (!differences.ok()) return differences.status();
  *same_bits = *differences == 0;
  if (!*same_bits) {
    std::printf(
        "note: %s %s: Strata's and the baseline's c differ in %lld of %lld elements; the same algorithm "
        "gives the same bits, so the two may not be running the same kernel\n",
        TypeInfo<T>::kName, s.name.c_str(), static_cast<long long>(*differences), static_cast<long long>(ElementsC(s)));
  }
  return absl::OkStatus();
}

template <typename T>
absl::Status Runner::Run(const std::vector<GemmShape>& shapes, int repeats, std::vector<ShapeResult>* results) {
  const char* name = TypeInfo<T>::kName;
  // One buffer per operand, big enough for every shape; each shape uses a prefix.
  int64_t max_a = 0, max_b = 0, max_c = 0;
  for (const GemmShape& s : shapes) {
    max_a = std::max(max_a, ElementsA(s));
    max_b = std::max(max_b, ElementsB(s));
    max_c = std::max(max_c, ElementsC(s));
  }
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(max_a * sizeof(T), "a");
  if (!a.ok()) return a.status();
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(max_b * sizeof(T), "b");
  if (!b.ok()) return b.status();
  absl::StatusOr<DeviceBuffer> c_strata = DeviceBuffer::Allocate(max_c * sizeof(T), "Strata's c");
  if (!c_strata.ok()) return c_strata.status();
  absl::StatusOr<DeviceBuffer> c_baseline = DeviceBuffer::Allocate(max_c * sizeof(T), "the baseline's c");
  if (!c_baseline.ok()) return c_baseline.status();
  BENCH_RETURN_IF_ERROR(FillDevice(a->as<T>(), max_a, kSeedA));
  BENCH_RETURN_IF_ERROR(FillDevice(b->as<T>(), max_b, kSeedB));

  // Strata's side: one LtGemm, as a kernel context holds one per stream.
  absl::StatusOr<std::unique_ptr<cuda::LtGemm>> gemm = cuda::LtGemm::Create();
  if (!gemm.ok()) return gemm.status();
  cuda::KeptBlockAllocator scratch;  // as the caching allocator serves it
  if (absl::GetFlag(FLAGS_staging)) (*gemm)->set_scratch_allocator(&scratch);
  // The baseline's own handle and a workspace of the same size.
  const size_t workspace_bytes = cuda::LtGemm::kDefaultWorkspaceBytes;
  absl::StatusOr<DeviceBuffer> workspace = DeviceBuffer::Allocate(workspace_bytes, "the baseline's workspace");
  if (!workspace.ok()) return workspace.status();
  cublasLtHandle_t handle = nullptr;
  BENCH_RETURN_IF_ERROR(LtStatus(cublasLtCreate(&handle), "create"));
  std::unique_ptr<cublasLtContext, cublasStatus_t (*)(cublasLtHandle_t)> handle_owner(handle, cublasLtDestroy);

  // Prepared once per shape, outside all timing.
  std::vector<std::unique_ptr<DirectLtMatmul>> direct;
  for (const GemmShape& s : shapes) {
    absl::StatusOr<std::unique_ptr<DirectLtMatmul>> d =
        DirectLtMatmul::Create(handle, TypeInfo<T>::kCuda, s, a->as<T>(), b->as<T>(), c_baseline->as<T>(),
                               workspace->as<void>(), workspace_bytes);
    if (!d.ok()) {
      return absl::Status(d.status().code(), absl::StrCat(name, " ", s.name, ": ", d.status().message()));
    }
    direct.push_back(*std::move(d));
  }

  // The two sides of shape i; each returns the call's status.
  auto strata_call = [&](size_t i) -> absl::Status {
    const GemmShape& s = shapes[i];
    return (*gemm)->Matmul(c_strata->as<T>(), a->as<T>(), b->as<T>(), s.m, s.n, s.k, s.transpose_a, s.transpose_b,
                           stream_);
  };
  auto baseline_call = [&](size_t i) -> absl::Status { return LtStatus(direct[i]->Run(stream_), "matmul"); };
  auto in_context = [&](size_t i, const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(name, " ", shapes[i].name, ": ", status.message()));
  };

  results->clear();
  for (size_t i = 0; i < shapes.size(); ++i) {
    const GemmShape& s = shapes[i];
    // Validate first: different garbage in the two c's, so equal bits mean both ran.
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(c_strata->as<T>(), 0xff, ElementsC(s) * sizeof(T)), "memset"));
    BENCH_RETURN_IF_ERROR(CudaStatus(cudaMemset(c_baseline->as<T>(), 0x7f, ElementsC(s) * sizeof(T)), "memset"));
    absl::Status status = strata_call(i);
    if (status.ok()) status = baseline_call(i);
    if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream_), "first GEMMs");
    ShapeResult result;
    result.shape = s;
    if (status.ok()) status = Validate(s, c_strata->as<T>(), c_baseline->as<T>(), &result.same_bits);
    if (!status.ok()) return in_context(i, status);

    // Enough calls for --min_ms, judged from a short timed run after a warm-up.
    for (int w = 0; w < std::max(1, absl::GetFlag(FLAGS_warmup)); ++w) {
      if (!(status = strata_call(i)).ok() || !(status = baseline_call(i)).ok()) return in_context(i, status);
    }
    absl::StatusOr<double> probe = TimePerCallMs([&] { return baseline_call(i); }, 3, stream_, start_, stop_);
    if (!probe.ok()) return in_context(i, probe.status());
    const double wanted = absl::GetFlag(FLAGS_min_ms) / std::max(*probe, 1e-6);
    result.iterations =
        static_cast<int>(std::min(1e6, std::max<double>(absl::GetFlag(FLAGS_min_iters), std::ceil(wanted))));
    results->push_back(std::move(result));
  }

  // The whole measurement, --repeats times; the sides alternate going first.
  for (int r = 0; r < repeats; ++r) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      ShapeResult& result = (*results)[i];
      for (int side = 0; side < 2; ++side) {
        const bool strata_side = (side == 0) == (r % 2 == 0);
        auto call = [&] { return strata_side ? strata_call(i) : baseline_call(i); };
        for (int w = 0; w < absl::GetFlag(FLAGS_warmup); ++w) {
          const absl::Status status = call();
          if (!status.ok()) return in_context(i, status);
        }
        absl::StatusOr<double> ms = TimePerCallMs(call, result.iterations, stream_, start_, stop_);
        if (!ms.ok()) return in_context(i, ms.status());
        (strata_side ? result.strata_ms : result.baseline_ms).push_back(*ms);
      }
    }
  }
  if ((*gemm)->cached_plans() != shapes.size()) {
    std::printf("note: %s: Strata's LtGemm holds %zu plans for %zu shapes (expected one per shape)\n", name,
                (*gemm)->cached_plans(), shapes.size());
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- report

std::string Percent(double ratio) { return absl::StrFormat("%.1f%%", 100 * ratio); }

void PrintTable(const char* dtype, const char* description, const std::vector<ShapeResult>& results, int repeats) {
  std::printf("\n== %s: %s ==\n", dtype, description);
  std::printf("%-14s %6s %6s %6s %2s %2s %4s %6s | %9s %8s | %9s %8s | %8s %-17s %4s %4s\n", "shape", "M", "N", "K",
              "tA", "tB", "step", "calls", "strata ms", "TFLOP/s", "base ms", "TFLOP/s", "ratio",
              absl::StrCat("[min-max of ", repeats, "]").c_str(), "goal", "bits");
  auto row = [&](const std::string& label, const std::string& dims, double flops, double strata_ms, double baseline_ms,
                 double ratio_min, double ratio_max, const char* bits) {
    const double ratio = baseline_ms / strata_ms;
    std::printf("%-14s %s | %9.3f %8.1f | %9.3f %8.1f | %8s %-17s %4s %4s\n", label.c_str(), dims.c_str(), strata_ms,
                Tflops(flops, strata_ms), baseline_ms, Tflops(flops, baseline_ms), Percent(ratio).c_str(),
                absl::StrCat("[", Percent(ratio_min), "-", Percent(ratio_max), "]").c_str(),
                ratio >= kGoal ? "PASS" : "MISS", bits);
  };
  for (const ShapeResult& r : results) {
    const GemmShape& s = r.shape;
    double ratio_min = 1e30, ratio_max = 0;
    for (int i = 0; i < repeats; ++i) {
      ratio_min = std::min(ratio_min, r.baseline_ms[i] / r.strata_ms[i]);
      ratio_max = std::max(ratio_max, r.baseline_ms[i] / r.strata_ms[i]);
    }
    const std::string dims = absl::StrFormat("%6d %6d %6d %2s %2s %4d %6d", s.m, s.n, s.k, s.transpose_a ? "T" : "N",
                                             s.transpose_b ? "T" : "N", s.per_step, r.iterations);
    row(s.name, dims, s.flops(), Median(r.strata_ms), Median(r.baseline_ms), ratio_min, ratio_max,
        r.same_bits ? "same" : "DIFF");
  }
  // Totals: times summed over shapes (so each shape weighs by its time), per
  // repeat; the ratio of the sums, and its spread over the repeats.
  for (const bool per_step : {false, true}) {
    double flops = 0;
    std::vector<double> strata(repeats, 0.0), baseline(repeats, 0.0);
    for (const ShapeResult& r : results) {
      const int count = per_step ? r.shape.per_step : 1;
      flops += count * r.shape.flops();
      for (int i = 0; i < repeats; ++i) {
        strata[i] += count * r.strata_ms[i];
        baseline[i] += count * r.baseline_ms[i];
      }
    }
    double ratio_min = 1e30, ratio_max = 0;
    for (int i = 0; i < repeats; ++i) {
      ratio_min = std::min(ratio_min, baseline[i] / strata[i]);
      ratio_max = std::max(ratio_max, baseline[i] / strata[i]);
    }
    const double strata_ms = Median(strata), baseline_ms = Median(baseline);
    row(per_step ? "total, 1 step" : "total, each 1x", absl::StrFormat("%38s", per_step ? "(x step count)" : ""), flops,
        strata_ms, baseline_ms, ratio_min, ratio_max, "");
    if (per_step) {
      std::printf(
          "RESULT dtype=%s strata_ms=%.4f baseline_ms=%.4f strata_tflops=%.2f baseline_tflops=%.2f "
          "ratio=%.4f ratio_min=%.4f ratio_max=%.4f goal=%.2f\n",
          dtype, strata_ms, baseline_ms, Tflops(flops, strata_ms), Tflops(flops, baseline_ms), baseline_ms / strata_ms,
          ratio_min, ratio_max, kGoal);
    }
  }
}

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[64];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &utc);
  return text;
}

// --epilogues: each forward linear (bf16 operands, bf16 out) as a plain
// GEMM, with the bias epilogue (matmul_bias's call under mixed precision:
// a bf16 bias beside the bf16 D since passes/cast_bias, and the float bias
// of the plans before it, "/f32bias") and, for mlp.fc, with GELU_AUX_BIAS
// (a bf16 aux z, as the plan asks since gelu runs in bf16, beside a bf16 and
// a float bias, and a float aux);
// each weight gradient (float dW) plain, with the bias gradient (BGRADA,
// as cuda_ops.cc calls it) and with it apart (the plain GEMM then ones @
// dy, STRATA_FUSED_BIAS_GRAD=0's path; the kernel also fills its ones
// vector each call, one small launch left out here); mlp.proj's dx plain
// and with the gelu's derivative (DGELU, matmul_gelu_grad's GEMM). Prints
// ms a call and the fused call's time over the plain one; where cuBLASLt
// refuses the fused call (a float bias beside a 16-bit D, counted and
// printed at the end; a bf16 one, not counted) or has no algorithm, the row
// shows "-" and the reason, and the op's kernel would run the float GEMM
// and a cast. "matmul_bias" is the bf16 bias since cast-bias (2026-11-29);
// earlier figures of that row were the float bias's, "/f32bias" now.
absl::Status TimeEpilogues(const std::vector<GemmShape>& shapes, int repeats, cudaStream_t stream, cudaEvent_t start,
                           cudaEvent_t stop) {
  int64_t max_a = 0, max_b = 0, max_c = 0, max_n = 0;
  for (const GemmShape& s : shapes) {
    max_a = std::max(max_a, ElementsA(s));
    max_b = std::max(max_b, ElementsB(s));
    max_c = std::max(max_c, ElementsC(s));
    max_n = std::max({max_n, s.n, s.m});
  }
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(max_a * 2, "a");
  if (!a.ok()) return a.status();
  absl::StatusOr<DeviceBuffer> b = DeviceBuffer::Allocate(max_b * 2, "b");
  if (!b.ok()) return b.status();
  absl::StatusOr<DeviceBuffer> c = DeviceBuffer::Allocate(max_c * 4, "c");
  if (!c.ok()) return c.status();
  absl::StatusOr<DeviceBuffer> z = DeviceBuffer::Allocate(max_c * 4, "z");
  if (!z.ok()) return z.status();
  absl::StatusOr<DeviceBuffer> bias = DeviceBuffer::Allocate(max_n * 4, "bias");
  if (!bias.ok()) return bias.status();
  absl::StatusOr<DeviceBuffer> bias16 = DeviceBuffer::Allocate(max_n * 2, "bf16 bias");
  if (!bias16.ok()) return bias16.status();
  BENCH_RETURN_IF_ERROR(FillDevice(a->as<__nv_bfloat16>(), max_a, kSeedA));
  BENCH_RETURN_IF_ERROR(FillDevice(b->as<__nv_bfloat16>(), max_b, kSeedB));
  BENCH_RETURN_IF_ERROR(FillDevice(bias->as<float>(), max_n, kSeedA + 7));
  BENCH_RETURN_IF_ERROR(FillDevice(bias16->as<__nv_bfloat16>(), max_n, kSeedA + 8));
  // bf16 ones (the unfused bias gradient's ones @ dy), one per row of dy.
  int64_t max_k = 0;
  for (const GemmShape& s : shapes) max_k = std::max(max_k, s.k);
  absl::StatusOr<DeviceBuffer> ones = DeviceBuffer::Allocate(max_k * 2, "ones");
  if (!ones.ok()) return ones.status();
  {
    const std::vector<uint16_t> host(static_cast<size_t>(max_k), 0x3F80);  // 1.0 in bf16
    BENCH_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpy(ones->as<uint16_t>(), host.data(), max_k * 2, cudaMemcpyHostToDevice), "upload of ones"));
  }
  BENCH_RETURN_IF_ERROR(FillDevice(z->as<__nv_bfloat16>(), max_c, kSeedB + 7));  // DGELU's aux input
  absl::StatusOr<std::unique_ptr<cuda::LtGemm>> gemm = cuda::LtGemm::Create();
  if (!gemm.ok()) return gemm.status();
  cuda::LtGemm& g = **gemm;
  const auto* A = a->as<__nv_bfloat16>();
  const auto* B = b->as<__nv_bfloat16>();
  const auto median_ms = [&](const auto& call) -> absl::StatusOr<double> {
    for (int i = 0; i < absl::GetFlag(FLAGS_warmup); ++i) BENCH_RETURN_IF_ERROR(call());
    std::vector<double> ms;
    for (int r = 0; r < repeats; ++r) {
      absl::StatusOr<double> t = TimePerCallMs(call, absl::GetFlag(FLAGS_min_iters), stream, start, stop);
      if (!t.ok()) return t.status();
      ms.push_back(*t);
    }
    return Median(std::move(ms));
  };
  std::printf("\n== bf16 epilogues as the plan runs them: ms a call (median of %d), fused / plain ==\n", repeats);
  std::printf("%-16s %-25s %9s %9s %7s\n", "shape", "fused op", "plain", "fused", "ratio");
  for (const GemmShape& s : shapes) {
    const bool fwd = absl::EndsWith(s.name, ".fwd") && !absl::StartsWith(s.name, "lm_head");
    const bool dw = absl::EndsWith(s.name, ".dw") && !absl::StartsWith(s.name, "lm_head");
    const bool dgelu = s.name == "mlp.proj.dx";  // dh = dy @ W^T, whose reader is the gelu's gradient
    if (!fwd && !dw && !dgelu) continue;
    std::vector<std::pair<std::string, std::function<absl::Status()>>> fused;
    std::function<absl::Status()> plain;
    if (fwd) {
      auto* c16 = c->as<__nv_bfloat16>();
      plain = [&, c16] { return g.Matmul(c16, A, B, s.m, s.n, s.k, false, false, stream); };
      const auto* bias_bf16 = bias16->as<__nv_bfloat16>();
      fused.push_back({"matmul_bias", [&, c16, bias_bf16] {
                         return g.MatmulBias(c16, A, B, bias_bf16, s.m, s.n, s.k, false, stream);
                       }});
      fused.push_back({"matmul_bias/f32bias", [&, c16] {
                         return g.MatmulBias(c16, A, B, bias->as<float>(), s.m, s.n, s.k, false, stream);
                       }});
      if (s.name == "mlp.fc.fwd") {
        // The plan's matmul_bias_gelu: a bf16 aux (z_dtype, gelu in bf16)
        // beside a bf16 bias (cast-bias); then beside a float bias (the plans
        // before cast-bias), and a float aux z (before mixed precision ran
        // gelu in bf16; cuBLASLt documents the aux in D's type only).
        fused.push_back({"matmul_bias_gelu", [&, c16, bias_bf16] {
                           return g.MatmulBiasGelu(c16, z->as<__nv_bfloat16>(), A, B, bias_bf16, s.m, s.n, s.k, false,
                                                   stream);
                         }});
        fused.push_back({"matmul_bias_gelu/f32bias", [&, c16] {
                           return g.MatmulBiasGelu(c16, z->as<__nv_bfloat16>(), A, B, bias->as<float>(), s.m, s.n,
                                                   s.k, false, stream);
                         }});
        fused.push_back({"matmul_bias_gelu/f32z", [&, c16] {
                           return g.MatmulBiasGelu(c16, z->as<float>(), A, B, bias->as<float>(), s.m, s.n, s.k, false,
                                                   stream);
                         }});
      }
    } else if (dgelu) {
      // matmul_gelu_grad: DGELU with the bf16 pre-activation as its aux
      // (the plain GEMM leaves out the gelu_grad pass the unfused plan adds).
      auto* c16 = c->as<__nv_bfloat16>();
      plain = [&, c16] { return g.Matmul(c16, A, B, s.m, s.n, s.k, false, true, stream); };
      fused.push_back({"matmul_gelu_grad", [&, c16] {
                         return g.MatmulGeluGrad(c16, A, B, z->as<__nv_bfloat16>(), s.m, s.n, s.k, true, stream);
                       }});
    } else {
      auto* c32 = c->as<float>();
      plain = [&, c32] { return g.Matmul(c32, A, B, s.m, s.n, s.k, true, false, stream); };
      fused.push_back({"matmul_bias_grad_b", [&, c32] {
                         return g.MatmulBiasGrad(c32, bias->as<float>(), A, B, s.m, s.n, s.k, true, false,
                                                 cuda::LtGemm::BiasGradOf::kB, stream);
                       }});
      // The same op with the fused bias gradient off (STRATA_FUSED_BIAS_GRAD=0):
      // the plain GEMM, then dbias = ones @ dy.
      fused.push_back({"matmul_bias_grad_b/apart", [&, c32] {
                         BENCH_RETURN_IF_ERROR(g.Matmul(c32, A, B, s.m, s.n, s.k, true, false, stream));
                         return g.Matmul(bias->as<float>(), ones->as<__nv_bfloat16>(), B, 1, s.n, s.k, false, false,
                                         stream);
                       }});
    }
    absl::StatusOr<double> plain_ms = median_ms(plain);
    if (!plain_ms.ok()) return plain_ms.status();
    for (const auto& [what, call] : fused) {
      absl::StatusOr<double> fused_ms = median_ms(call);
      if (!fused_ms.ok()) {
        std::printf("%-16s %-25s %9.4f %9s   (%s)\n", s.name.c_str(), what.c_str(), *plain_ms, "-",
                    std::string(fused_ms.status().message()).substr(0, 80).c_str());
        continue;
      }
      std::printf("%-16s %-25s %9.4f %9.4f %6.2fx\n", s.name.c_str(), what.c_str(), *plain_ms, *fused_ms,
                  *fused_ms / *plain_ms);
      std::printf("RESULT epilogue shape=%s op=%s plain_ms=%.5f fused_ms=%.5f ratio=%.3f\n", s.name.c_str(),
                  what.c_str(), *plain_ms, *fused_ms, *fused_ms / *plain_ms);
    }
  }
  std::printf("cuBLASLt refused a float bias or aux beside a 16-bit D %lld times\n",
              static_cast<long long>(g.float_epilogue_refusals()));
  return absl::OkStatus();
}

absl::Status Main(const std::vector<char*>& positional) {
  if (positional.size() > 1) return absl::InvalidArgumentError(absl::StrCat("unexpected argument ", positional[1]));
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype != "f32" && dtype != "bf16" && dtype != "both") {
    return absl::InvalidArgumentError(absl::StrCat("--dtype must be f32, bf16 or both, not '", dtype, "'"));
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (repeats < 1) return absl::InvalidArgumentError("--repeats must be >= 1");
  if (absl::GetFlag(FLAGS_min_iters) < 1) return absl::InvalidArgumentError("--min_iters must be >= 1");

  std::vector<GemmShape> shapes = Gpt2TrainingShapes();
  if (!absl::GetFlag(FLAGS_shapes).empty()) {
    std::vector<GemmShape> chosen;
    for (absl::string_view wanted : absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
      auto it = std::find_if(shapes.begin(), shapes.end(), [&](const GemmShape& s) { return s.name == wanted; });
      if (it == shapes.end()) {
        std::vector<std::string> names;
        for (const GemmShape& s : shapes) names.push_back(s.name);
        return absl::InvalidArgumentError(
            absl::StrCat("--shapes: no shape '", wanted, "'; the shapes are ", absl::StrJoin(names, ",")));
      }
      chosen.push_back(*it);
    }
    shapes = std::move(chosen);
  }

  std::string why;
  if (cuda::CudaDeviceCount(&why) == 0) return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", why));
  int device = 0;
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaGetDevice(&device), "get device"));
  cudaDeviceProp prop;
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "device properties"));

  std::printf(
      "gemm_bench: the GEMMs of a GPT-2 124M training step, 8 x 1024 tokens (attention's batched GEMMs "
      "left out)\n");
  std::printf("date: %s\n", UtcNow().c_str());
  std::printf("GPU %d: %s, sm_%d%d, %d SMs, %zu MiB\n", device, prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, prop.totalGlobalMem >> 20);
  std::fputs(cuda::DescribeCuda().c_str(), stdout);
  std::printf(
      "strata: LtGemm::Matmul (plan cached per shape); base: the same cublasLtMatmul prepared once "
      "(same heuristic, %zu MiB workspace each)\n",
      cuda::LtGemm::kDefaultWorkspaceBytes >> 20);
  std::printf(
      "each timing: %d warm-up calls, then >= %d back-to-back calls and >= %g ms between CUDA events; %d "
      "repeats, sides alternating first\n",
      absl::GetFlag(FLAGS_warmup), absl::GetFlag(FLAGS_min_iters), absl::GetFlag(FLAGS_min_ms), repeats);
  std::printf(
      "TFLOP/s = 2 M N K / time per GEMM; ratio = base ms / strata ms (goal >= %s); ms = median over "
      "repeats; step = runs per training step; bits: Strata's c equals the baseline's bit for bit\n",
      Percent(kGoal).c_str());
  std::fflush(stdout);

  cudaStream_t stream = nullptr;
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream"));
  std::unique_ptr<CUstream_st, cudaError_t (*)(cudaStream_t)> stream_owner(stream, cudaStreamDestroy);
  cudaEvent_t start = nullptr, stop = nullptr;
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "event"));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> start_owner(start, cudaEventDestroy);
  BENCH_RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&stop), "event"));
  std::unique_ptr<CUevent_st, cudaError_t (*)(cudaEvent_t)> stop_owner(stop, cudaEventDestroy);

  Runner runner(stream, start, stop);
  std::vector<ShapeResult> results;
  if (dtype == "f32" || dtype == "both") {
    BENCH_RETURN_IF_ERROR(runner.Run<float>(shapes, repeats, &results));
    PrintTable(TypeInfo<float>::kName, TypeInfo<float>::kDescription, results, repeats);
    std::fflush(stdout);
  }
  if (dtype == "bf16" || dtype == "both") {
    BENCH_RETURN_IF_ERROR(runner.Run<__nv_bfloat16>(shapes, repeats, &results));
    PrintTable(TypeInfo<__nv_bfloat16>::kName, TypeInfo<__nv_bfloat16>::kDescription, results, repeats);
  }
  if (absl::GetFlag(FLAGS_epilogues)) BENCH_RETURN_IF_ERROR(TimeEpilogues(shapes, repeats, stream, start, stop));
  return absl::OkStatus();
}

}  // namespace
}  // namespace bench
}  // namespace strata

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times Strata's LtGemm::Matmul against the bare cuBLASLt call on GPT-2 124M's training GEMMs.\n"
      "  gemm_bench [--dtype=f32|bf16|both] [--repeats=3] [--shapes=qkv.fwd,...]");
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const absl::Status status = strata::bench::Main(positional);
  if (!status.ok()) {
    std::fflush(stdout);
    std::fprintf(stderr, "error: %s\n", std::string(status.message()).c_str());
    return 1;
  }
  return 0;
}
