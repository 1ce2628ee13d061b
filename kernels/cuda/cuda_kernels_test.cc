// The CUDA kernels against the CPU kernels they mirror (run through the op
// registry, as the executor runs them), plus cuDNN and NCCL on the device.
// Tagged gpu: without a CUDA device every test FAILS (never skips), so a GPU
// run that silently found no GPU cannot pass.

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_info.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/kept_block_allocator.h"
#include "kernels/cuda/relu.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/gemm_staging.h"
#include "runtime/float16.h"
#include "runtime/tensor.h"

namespace strata {
namespace cuda {
namespace {

#define ASSERT_CUDA_OK(expr)                                                             \
  do {                                                                                   \
    const cudaError_t strata_cuda_error = (expr);                                        \
    ASSERT_EQ(strata_cuda_error, cudaSuccess) << #expr << ": "                           \
                                              << cudaGetErrorString(strata_cuda_error); \
  } while (false)

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    ASSERT_GT(CudaDeviceCount(&why), 0)
        << "no CUDA device (" << why << "). This test is tagged gpu: filter it out with "
        << "--test_tag_filters=-gpu, or run it on a GPU machine (kernels/cuda/README.md).";
    ASSERT_CUDA_OK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

// A device array of n T's (plus `offset` elements in front, to test
// misaligned operands), freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(int64_t n, int64_t offset = 0) : offset_(offset) {
    const size_t bytes = static_cast<size_t>(n + offset + 1) * sizeof(T);  // +1: never a 0-byte cudaMalloc
    error_ = cudaMalloc(&base_, bytes);
    if (error_ == cudaSuccess) error_ = cudaMemset(base_, 0xff, bytes);  // all-ones bytes: nan garbage
  }
  ~DeviceArray() { cudaFree(base_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  cudaError_t error() const { return error_; }
  T* get() { return base_ + offset_; }
  cudaError_t Upload(const std::vector<T>& host) {
    return cudaMemcpy(get(), host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  cudaError_t Download(std::vector<T>* host) {
    return cudaMemcpy(host->data(), get(), host->size() * sizeof(T), cudaMemcpyDeviceToHost);
  }

 private:
  T* base_ = nullptr;
  int64_t offset_;
  cudaError_t error_ = cudaSuccess;
};

template <typename T>
Tensor HostTensor(const std::vector<T>& values, Shape shape) {
  Tensor t = Tensor::Empty(DataTypeOf<T>::value, std::move(shape));
  if (!values.empty()) std::memcpy(t.data<T>(), values.data(), values.size() * sizeof(T));
  return t;
}

template <typename T>
std::vector<T> TensorToVector(const Tensor& t) {
  return std::vector<T>(t.data<T>(), t.data<T>() + t.num_elements());
}

// Runs one CPU op (registry, shape function, CPU kernel) and returns output "y".
template <typename T>
std::vector<T> RunCpu(const std::string& op_text, std::map<std::string, Tensor> env) {
  const absl::Status status = RunOp(ParseOp(op_text), &env);
  EXPECT_TRUE(status.ok()) << op_text << ": " << status;
  return status.ok() ? TensorToVector<T>(env.at("y")) : std::vector<T>();
}

// Bit for bit, so nan and the sign of zero count.
template <typename T>
::testing::AssertionResult BitwiseEqual(const std::vector<T>& actual, const std::vector<T>& expected) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure() << "size " << actual.size() << " vs " << expected.size();
  }
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::memcmp(&actual[i], &expected[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << actual[i] << " vs " << expected[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Uniform values in [-4, 4] after a prefix of the awkward ones.
template <typename T>
std::vector<T> ReluInput(int64_t n, uint32_t seed) {
  const T specials[] = {std::numeric_limits<T>::quiet_NaN(),
                        T(-0.0),
                        T(0.0),
                        std::numeric_limits<T>::infinity(),
                        -std::numeric_limits<T>::infinity(),
                        std::numeric_limits<T>::denorm_min(),
                        -std::numeric_limits<T>::denorm_min()};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<T> uniform(T(-4), T(4));
  std::vector<T> x(n);
  for (int64_t i = 0; i < n; ++i) x[i] = i < static_cast<int64_t>(std::size(specials)) ? specials[i] : uniform(rng);
  return x;
}

template <typename T>
void CheckRelu(cudaStream_t stream, int64_t n) {
  SCOPED_TRACE(absl::StrCat(DataTypeName(DataTypeOf<T>::value), " n=", n));
  const std::vector<T> x = ReluInput<T>(n, 1);
  const std::vector<T> dy = ReluInput<T>(n, 2);
  const std::vector<T> y_cpu =
      RunCpu<T>(R"pb(type: "relu" input: "x" output: "y")pb", {{"x", HostTensor(x, {n})}});
  const std::vector<T> dx_cpu = RunCpu<T>(R"pb(type: "relu_grad" input: [ "relu_y", "dy" ] output: "y")pb",
                                          {{"relu_y", HostTensor(y_cpu, {n})}, {"dy", HostTensor(dy, {n})}});
  ASSERT_EQ(y_cpu.size(), static_cast<size_t>(n));
  ASSERT_EQ(dx_cpu.size(), static_cast<size_t>(n));

  DeviceArray<T> x_dev(n), y_dev(n), dy_dev(n), dx_dev(n);
  for (auto* a : {&x_dev, &y_dev, &dy_dev, &dx_dev}) ASSERT_CUDA_OK(a->error());
  ASSERT_CUDA_OK(x_dev.Upload(x));
  ASSERT_CUDA_OK(dy_dev.Upload(dy));
  ASSERT_CUDA_OK(LaunchRelu(y_dev.get(), x_dev.get(), n, stream));
  ASSERT_CUDA_OK(LaunchReluGrad(dx_dev.get(), y_dev.get(), dy_dev.get(), n, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<T> y(n), dx(n);
  ASSERT_CUDA_OK(y_dev.Download(&y));
  ASSERT_CUDA_OK(dx_dev.Download(&dx));
  EXPECT_TRUE(BitwiseEqual(y, y_cpu)) << "relu";
  EXPECT_TRUE(BitwiseEqual(dx, dx_cpu)) << "relu_grad";

  // In place, as the executor may run them when the input dies here.
  ASSERT_CUDA_OK(LaunchRelu(x_dev.get(), x_dev.get(), n, stream));
  ASSERT_CUDA_OK(LaunchReluGrad(dy_dev.get(), y_dev.get(), dy_dev.get(), n, stream));
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  ASSERT_CUDA_OK(x_dev.Download(&y));
  ASSERT_CUDA_OK(dy_dev.Download(&dx));
  EXPECT_TRUE(BitwiseEqual(y, y_cpu)) << "relu in place";
  EXPECT_TRUE(BitwiseEqual(dx, dx_cpu)) << "relu_grad in place";
}

// 65536 blocks of 256 threads cover 2^24 elements; the large size makes the
// grid-stride loop go round a second time.
constexpr int64_t kOneFullGrid = int64_t{65536} * 256;

TEST_F(CudaKernelsTest, ReluMatchesCpuKernelFloat) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}, kOneFullGrid + 5}) CheckRelu<float>(stream_, n);
}

TEST_F(CudaKernelsTest, ReluMatchesCpuKernelDouble) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000003}, kOneFullGrid + 5}) CheckRelu<double>(stream_, n);
}

TEST_F(CudaKernelsTest, ReluOfNothingLaunchesNothing) {
  EXPECT_EQ(LaunchRelu(static_cast<float*>(nullptr), nullptr, 0, stream_), cudaSuccess);
  EXPECT_EQ(LaunchReluGrad(static_cast<double*>(nullptr), nullptr, nullptr, 0, stream_), cudaSuccess);
}

struct GemmCase {
  int64_t m, n, k;
  bool transpose_a, transpose_b;
  // Small integers: every product and partial sum is exact in float, so any
  // summation order gives the same answer and GPU must equal CPU exactly.
  bool integers;
  int64_t offset = 0;  // elements of misalignment of every operand
};

std::string Describe(const GemmCase& c) {
  return absl::StrCat("m=", c.m, " n=", c.n, " k=", c.k, " transpose_a=", c.transpose_a,
                      " transpose_b=", c.transpose_b, c.integers ? " integers" : " reals", " offset=", c.offset);
}

template <typename T>
std::vector<T> GemmInput(int64_t size, bool integers, std::mt19937* rng) {
  std::uniform_int_distribution<int> small_int(-8, 8);
  std::uniform_real_distribution<T> uniform(T(-1), T(1));
  std::vector<T> v(size);
  for (T& e : v) e = integers ? T(small_int(*rng)) : uniform(*rng);
  return v;
}

// The CPU matmul op of a case: y = op(a) @ op(b).
std::string MatmulOpText(const GemmCase& c) {
  return absl::StrCat(R"pb(type: "matmul" input: [ "a", "b" ] output: "y" )pb",
                      R"pb(attr { key: "transpose_a" value { b: )pb", c.transpose_a ? "true" : "false", " } } ",
                      R"pb(attr { key: "transpose_b" value { b: )pb", c.transpose_b ? "true" : "false", " } }");
}

// The CPU kernel's answer for a case, through the registry.
template <typename T>
std::vector<T> CpuMatmul(const GemmCase& c, const std::vector<T>& a, const std::vector<T>& b) {
  const Shape a_shape = c.transpose_a ? Shape{c.k, c.m} : Shape{c.m, c.k};
  const Shape b_shape = c.transpose_b ? Shape{c.n, c.k} : Shape{c.k, c.n};
  return RunCpu<T>(MatmulOpText(c), {{"a", HostTensor(a, a_shape)}, {"b", HostTensor(b, b_shape)}});
}

template <typename T>
void CheckGemm(LtGemm* gemm, cudaStream_t stream, const GemmCase& c) {
  SCOPED_TRACE(absl::StrCat(DataTypeName(DataTypeOf<T>::value), " ", Describe(c)));
  std::mt19937 rng(static_cast<uint32_t>(c.m * 1000003 + c.n * 1009 + c.k));
  const std::vector<T> a = GemmInput<T>(c.m * c.k, c.integers, &rng);
  const std::vector<T> b = GemmInput<T>(c.k * c.n, c.integers, &rng);
  const std::vector<T> c_cpu = CpuMatmul(c, a, b);
  ASSERT_EQ(c_cpu.size(), static_cast<size_t>(c.m * c.n));

  DeviceArray<T> a_dev(c.m * c.k, c.offset), b_dev(c.k * c.n, c.offset), c_dev(c.m * c.n, c.offset);
  for (auto* d : {&a_dev, &b_dev, &c_dev}) ASSERT_CUDA_OK(d->error());
  ASSERT_CUDA_OK(a_dev.Upload(a));
  ASSERT_CUDA_OK(b_dev.Upload(b));
  const absl::Status status =
      gemm->Matmul(c_dev.get(), a_dev.get(), b_dev.get(), c.m, c.n, c.k, c.transpose_a, c.transpose_b, stream);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<T> c_gpu(c.m * c.n);
  ASSERT_CUDA_OK(c_dev.Download(&c_gpu));

  // For reals, each of CPU and GPU is within gamma_k * (|a| |b|)[i, j] of the
  // exact product (any summation order), gamma_k ~ k u, u the unit roundoff.
  const double u = std::numeric_limits<T>::epsilon() / 2;
  int reported = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double abs_product = 0;
      for (int64_t p = 0; p < c.k; ++p) {
        const T a_ip = c.transpose_a ? a[p * c.m + i] : a[i * c.k + p];
        const T b_pj = c.transpose_b ? b[j * c.k + p] : b[p * c.n + j];
        abs_product += std::fabs(double(a_ip)) * std::fabs(double(b_pj));
      }
      const double tolerance = c.integers ? 0.0 : 2.0 * (c.k + 2) * u * abs_product;
      const double error = std::fabs(double(c_gpu[i * c.n + j]) - double(c_cpu[i * c.n + j]));
      if (!(error <= tolerance) && reported++ < 5) {
        ADD_FAILURE() << "c[" << i << ", " << j << "] = " << c_gpu[i * c.n + j] << ", CPU " << c_cpu[i * c.n + j]
                      << ", tolerance " << tolerance;
      }
    }
  }
}

std::vector<GemmCase> GemmCases() {
  std::vector<GemmCase> cases;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      cases.push_back({1, 1, 1, ta, tb, true});
      cases.push_back({7, 5, 3, ta, tb, true});
      cases.push_back({129, 67, 257, ta, tb, true});
      cases.push_back({64, 48, 96, ta, tb, false});
      cases.push_back({200, 130, 300, ta, tb, false});
      cases.push_back({33, 17, 9, ta, tb, false, /*offset=*/1});
    }
  }
  cases.push_back({512, 512, 512, false, false, false});
  cases.push_back({5, 4, 0, false, false, true});  // empty sum: zeros
  cases.push_back({0, 4, 3, false, false, true});
  cases.push_back({5, 0, 3, false, true, true});
  return cases;
}

TEST_F(CudaKernelsTest, GemmMatchesCpuMatmulFloat) {
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const GemmCase& c : GemmCases()) CheckGemm<float>(gemm->get(), stream_, c);
}

TEST_F(CudaKernelsTest, GemmMatchesCpuMatmulDouble) {
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  for (const GemmCase& c : GemmCases()) CheckGemm<double>(gemm->get(), stream_, c);
}

TEST_F(CudaKernelsTest, GemmRejectsNegativeSizes) {
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const float* none = nullptr;
  const absl::Status status = (*gemm)->Matmul(static_cast<float*>(nullptr), none, none, 2, -1, 3, false, false,
                                              stream_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

// bf16 in and out, FP32 sums: against the CPU float GEMM of the same
// bf16-rounded inputs, within 2e-2 of the largest |c| (the issue's bar for
// bf16; one rounding of the output alone costs up to 2^-9 of |c|).
void CheckGemmBf16(LtGemm* gemm, cudaStream_t stream, const GemmCase& c) {
  SCOPED_TRACE(absl::StrCat("bf16 ", Describe(c)));
  std::mt19937 rng(static_cast<uint32_t>(c.m * 1000003 + c.n * 1009 + c.k + 7));
  std::vector<float> a = GemmInput<float>(c.m * c.k, c.integers, &rng);
  std::vector<float> b = GemmInput<float>(c.k * c.n, c.integers, &rng);
  std::vector<bfloat16> a_bf16(a.size()), b_bf16(b.size());
  for (size_t i = 0; i < a.size(); ++i) a[i] = ToFloat(a_bf16[i] = ToBfloat16(a[i]));
  for (size_t i = 0; i < b.size(); ++i) b[i] = ToFloat(b_bf16[i] = ToBfloat16(b[i]));
  const std::vector<float> c_cpu = CpuMatmul(c, a, b);
  ASSERT_EQ(c_cpu.size(), static_cast<size_t>(c.m * c.n));

  DeviceArray<bfloat16> a_dev(c.m * c.k, c.offset), b_dev(c.k * c.n, c.offset), c_dev(c.m * c.n, c.offset);
  for (auto* d : {&a_dev, &b_dev, &c_dev}) ASSERT_CUDA_OK(d->error());
  ASSERT_CUDA_OK(a_dev.Upload(a_bf16));
  ASSERT_CUDA_OK(b_dev.Upload(b_bf16));
  static_assert(sizeof(bfloat16) == sizeof(__nv_bfloat16), "both are the 16 bits of a bf16");
  const absl::Status status = gemm->Matmul(reinterpret_cast<__nv_bfloat16*>(c_dev.get()),
                                           reinterpret_cast<const __nv_bfloat16*>(a_dev.get()),
                                           reinterpret_cast<const __nv_bfloat16*>(b_dev.get()), c.m, c.n, c.k,
                                           c.transpose_a, c.transpose_b, stream);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<bfloat16> c_gpu(c.m * c.n);
  ASSERT_CUDA_OK(c_dev.Download(&c_gpu));

  double largest = 0;
  for (float v : c_cpu) largest = std::max(largest, std::fabs(double(v)));
  const double tolerance = 2e-2 * largest;  // 0 for k == 0: exact zeros
  int reported = 0;
  for (size_t i = 0; i < c_cpu.size(); ++i) {
    const double error = std::fabs(double(ToFloat(c_gpu[i])) - double(c_cpu[i]));
    if (!(error <= tolerance) && reported++ < 5) {
      ADD_FAILURE() << "c[" << i / c.n << ", " << i % c.n << "] = " << ToFloat(c_gpu[i]) << ", CPU " << c_cpu[i]
                    << ", tolerance " << tolerance << " (2e-2 of the largest |c|, " << largest << ")";
    }
  }
}

TEST_F(CudaKernelsTest, GemmMatchesCpuMatmulBf16) {
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::vector<GemmCase> cases = GemmCases();  // 7x5x3, 129x67x257, ...: not multiples of 8 either
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      cases.push_back({1000, 1001, 999, ta, tb, false});  // odd leading dimensions, big enough for tensor cores
      cases.push_back({64, 72, 40, ta, tb, false, /*offset=*/8});  // 16-byte aligned views
    }
  }
  for (const GemmCase& c : cases) CheckGemmBf16(gemm->get(), stream_, c);
}

// Every case again with every misaligned operand staged (the threshold at
// 0): copied into padded rows, the GEMM on the copies, c copied back. The
// integer cases must still equal the CPU exactly; each case allocates
// scratch exactly when PlanGemmStaging stages one of its operands (7 x 5 x
// 3 stages a, b and c; the 1000 x 1001 x 999 bf16 ones too).
TEST_F(CudaKernelsTest, GemmStagesMisalignedRowsThroughScratch) {
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::KeptBlockAllocator scratch;
  (*gemm)->set_scratch_allocator(&scratch);
  (*gemm)->set_staging_min_flops(0);
  auto expect_staged = [&](const GemmCase& c, int64_t bytes, int64_t before) {
    const bool staged = PlanGemmStaging(c.m, c.n, c.k, c.transpose_a, c.transpose_b, bytes, bytes, 0).any();
    EXPECT_EQ(scratch.total_allocations() - before, staged ? 1 : 0) << Describe(c);
  };
  for (const GemmCase& c : GemmCases()) {
    int64_t before = scratch.total_allocations();
    CheckGemm<float>(gemm->get(), stream_, c);
    expect_staged(c, 4, before);
    before = scratch.total_allocations();
    CheckGemm<double>(gemm->get(), stream_, c);
    expect_staged(c, 8, before);
  }
  std::vector<GemmCase> bf16 = GemmCases();
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) bf16.push_back({1000, 1001, 999, ta, tb, false});
  }
  for (const GemmCase& c : bf16) {
    const int64_t before = scratch.total_allocations();
    CheckGemmBf16(gemm->get(), stream_, c);
    expect_staged(c, 2, before);
  }
  EXPECT_EQ(scratch.live_bytes(), 0);
}

// c += op(a) @ op(b) with every operand's rows misaligned: c's present
// values go into the padded copy first, so the sum keeps them (integers:
// exact).
TEST_F(CudaKernelsTest, StagedGemmAccumulatesIntoC) {
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::KeptBlockAllocator scratch;
  (*gemm)->set_scratch_allocator(&scratch);
  (*gemm)->set_staging_min_flops(0);
  const GemmCase c{33, 9, 17, false, false, true};
  std::mt19937 rng(5);
  const std::vector<float> a = GemmInput<float>(c.m * c.k, true, &rng);
  const std::vector<float> b = GemmInput<float>(c.k * c.n, true, &rng);
  const std::vector<float> c0 = GemmInput<float>(c.m * c.n, true, &rng);
  const std::vector<float> product = CpuMatmul(c, a, b);
  DeviceArray<float> a_dev(c.m * c.k), b_dev(c.k * c.n), c_dev(c.m * c.n);
  for (auto* d : {&a_dev, &b_dev, &c_dev}) ASSERT_CUDA_OK(d->error());
  ASSERT_CUDA_OK(a_dev.Upload(a));
  ASSERT_CUDA_OK(b_dev.Upload(b));
  ASSERT_CUDA_OK(c_dev.Upload(c0));
  const absl::Status status = (*gemm)->Matmul(c_dev.get(), a_dev.get(), b_dev.get(), c.m, c.n, c.k, false, false,
                                              stream_, /*accumulate=*/true);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<float> got(c.m * c.n);
  ASSERT_CUDA_OK(c_dev.Download(&got));
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], c0[i] + product[i]) << "c[" << i << "]";
  EXPECT_EQ(scratch.total_allocations(), 1);
}

// MatmulBias with a residual (matmul_bias's, passes/fuse_epilogues): c =
// a @ b + bias + residual, the residual read as cuBLASLt's C with beta 1;
// rows of 36 bytes (n = 9: c staged through scratch, the residual copied
// into it first), rows of 64 bytes (not staged: C read where it is), and the
// residual in c itself (in place). Integers: exact, whatever the order. Where
// cuBLASLt has no algorithm (Unimplemented: the op's kernel then adds after
// the GEMM, which cuda_matmul_ops_test covers) it says so and c is untouched.
TEST_F(CudaKernelsTest, MatmulBiasAddsTheResidualAsC) {
  absl::StatusOr<std::unique_ptr<LtGemm>> gemm = LtGemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  cuda::KeptBlockAllocator scratch;
  (*gemm)->set_scratch_allocator(&scratch);
  (*gemm)->set_staging_min_flops(0);
  for (const GemmCase& c : {GemmCase{33, 9, 17, false, false, true}, GemmCase{32, 16, 24, false, false, true}}) {
    for (bool in_place : {false, true}) {
      SCOPED_TRACE(absl::StrCat(Describe(c), in_place ? " in place" : ""));
      std::mt19937 rng(7);
      const std::vector<float> a = GemmInput<float>(c.m * c.k, true, &rng);
      const std::vector<float> b = GemmInput<float>(c.k * c.n, true, &rng);
      const std::vector<float> bias = GemmInput<float>(c.n, true, &rng);
      const std::vector<float> r = GemmInput<float>(c.m * c.n, true, &rng);
      const std::vector<float> product = CpuMatmul(c, a, b);
      DeviceArray<float> a_dev(c.m * c.k), b_dev(c.k * c.n), bias_dev(c.n), r_dev(c.m * c.n), c_dev(c.m * c.n);
      for (auto* d : {&a_dev, &b_dev, &bias_dev, &r_dev, &c_dev}) ASSERT_CUDA_OK(d->error());
      ASSERT_CUDA_OK(a_dev.Upload(a));
      ASSERT_CUDA_OK(b_dev.Upload(b));
      ASSERT_CUDA_OK(bias_dev.Upload(bias));
      ASSERT_CUDA_OK(r_dev.Upload(r));
      ASSERT_CUDA_OK(c_dev.Upload(in_place ? r : std::vector<float>(c.m * c.n, 1000.0f)));
      const float* residual = in_place ? c_dev.get() : r_dev.get();
      const int64_t before = scratch.total_allocations();
      const absl::Status status = (*gemm)->MatmulBias(c_dev.get(), a_dev.get(), b_dev.get(), bias_dev.get(), c.m,
                                                      c.n, c.k, false, stream_, /*tf32=*/false, residual);
      ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
      std::vector<float> got(c.m * c.n);
      ASSERT_CUDA_OK(c_dev.Download(&got));
      if (status.code() == absl::StatusCode::kUnimplemented) {
        std::printf("no cuBLASLt algorithm for the residual: %s\n", status.ToString().c_str());
        RecordProperty(absl::StrCat("residual_unimplemented_n", c.n), 1);
        EXPECT_EQ(got, in_place ? r : std::vector<float>(c.m * c.n, 1000.0f));
        continue;
      }
      ASSERT_TRUE(status.ok()) << status;
      for (int64_t i = 0; i < c.m * c.n; ++i) {
        EXPECT_EQ(got[i], r[i] + (product[i] + bias[i % c.n])) << "c[" << i << "]";
      }
      const bool staged = PlanGemmStaging(c.m, c.n, c.k, false, false, 4, 4, 0).any();
      EXPECT_EQ(scratch.total_allocations() - before, staged ? 1 : 0);
    }
  }
  EXPECT_EQ(scratch.live_bytes(), 0);
}

// MatmulBiasGelu with bf16 operands and D beside a float bias: a float aux
// (matmul_bias_gelu's z by default) and a bf16 aux (its z_dtype "BF16") are
// two plans of one shape (the aux's type is in the plan key). Each either
// runs or says Unimplemented (refused, or no algorithm: the op's kernel then
// runs two passes, which cuda_matmul_ops_test covers), and each refusal has
// its line in epilogue_fallbacks(). Small integers: z is exact in float and,
// below 256 in magnitude, in bf16, so a bf16 z that ran equals the exact z.
TEST_F(CudaKernelsTest, MatmulBiasGeluKeepsAFloatAndABf16AuxApart) {
  absl::StatusOr<std::unique_ptr<LtGemm>> created = LtGemm::Create();
  ASSERT_TRUE(created.ok()) << created.status();
  LtGemm& gemm = **created;
  const int64_t m = 64, n = 64, k = 32;
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> small_int(-2, 2);
  std::vector<bfloat16> a(m * k), b(k * n);
  std::vector<float> bias(n);
  for (bfloat16& e : a) e = ToBfloat16(static_cast<float>(small_int(rng)));
  for (bfloat16& e : b) e = ToBfloat16(static_cast<float>(small_int(rng)));
  for (float& e : bias) e = static_cast<float>(4 * small_int(rng));
  std::vector<float> exact(m * n);  // |z| <= 2 * 2 * 32 + 8
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float sum = bias[j];
      for (int64_t p = 0; p < k; ++p) sum += ToFloat(a[i * k + p]) * ToFloat(b[p * n + j]);
      exact[i * n + j] = sum;
    }
  }
  DeviceArray<bfloat16> a_dev(m * k), b_dev(k * n), c_dev(m * n), z16_dev(m * n);
  DeviceArray<float> bias_dev(n), z32_dev(m * n);
  for (auto* d : {&a_dev, &b_dev, &c_dev, &z16_dev}) ASSERT_CUDA_OK(d->error());
  for (auto* d : {&bias_dev, &z32_dev}) ASSERT_CUDA_OK(d->error());
  ASSERT_CUDA_OK(a_dev.Upload(a));
  ASSERT_CUDA_OK(b_dev.Upload(b));
  ASSERT_CUDA_OK(bias_dev.Upload(bias));
  auto* c = reinterpret_cast<__nv_bfloat16*>(c_dev.get());
  const auto* pa = reinterpret_cast<const __nv_bfloat16*>(a_dev.get());
  const auto* pb = reinterpret_cast<const __nv_bfloat16*>(b_dev.get());

  const absl::Status float_aux = gemm.MatmulBiasGelu(c, z32_dev.get(), pa, pb, bias_dev.get(), m, n, k, false, stream_);
  EXPECT_TRUE(float_aux.ok() || float_aux.code() == absl::StatusCode::kUnimplemented) << float_aux;
  EXPECT_EQ(gemm.cached_plans(), 1u);
  const absl::Status bf16_aux = gemm.MatmulBiasGelu(c, reinterpret_cast<__nv_bfloat16*>(z16_dev.get()), pa, pb,
                                                    bias_dev.get(), m, n, k, false, stream_);
  EXPECT_TRUE(bf16_aux.ok() || bf16_aux.code() == absl::StatusCode::kUnimplemented) << bf16_aux;
  EXPECT_EQ(gemm.cached_plans(), 2u) << "a bf16 aux took the float aux's plan";
  std::printf("GELU_AUX_BIAS, bf16 D and a float bias: float aux %s, bf16 aux %s\n", float_aux.ok() ? "ran" : "refused",
              bf16_aux.ok() ? "ran" : "refused");
  RecordProperty("gelu_float_aux_ran", float_aux.ok() ? 1 : 0);
  RecordProperty("gelu_bf16_aux_ran", bf16_aux.ok() ? 1 : 0);
  EXPECT_EQ(gemm.epilogue_fallbacks().size(), (float_aux.ok() ? 0u : 1u) + (bf16_aux.ok() ? 0u : 1u));
  for (const std::string& line : gemm.epilogue_fallbacks()) std::printf("  %s\n", line.c_str());
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  if (bf16_aux.ok()) {
    std::vector<bfloat16> z(m * n);
    ASSERT_CUDA_OK(z16_dev.Download(&z));
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(ToFloat(z[i]), exact[i]) << "z[" << i << "]";
  }
  if (float_aux.ok()) {
    std::vector<float> z(m * n);
    ASSERT_CUDA_OK(z32_dev.Download(&z));
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(z[i], exact[i]) << "z[" << i << "]";
  }
}

// MatmulGeluGrad (cuBLASLt's DGELU, z its aux input in D's type): bf16
// operands of small integers, so the product is exact in float, and z over
// the derivative's range. Where it runs, c is gelu'(z) * product rounded
// once to bf16: within one bf16 spacing of the host's float formula, plus
// an allowance for a hardware tanh approximation in the epilogue (relative
// 2^-11 in t, carried through gelu'; an assumption, as
// MatmulBiasGeluMatchesTheCpu's). Where it has no algorithm it says
// Unimplemented and its line is in epilogue_fallbacks(). N not a multiple
// of 8, and k = 0, are Unimplemented without a plan.
TEST_F(CudaKernelsTest, MatmulGeluGradScalesTheProductByGeluPrime) {
  absl::StatusOr<std::unique_ptr<LtGemm>> created = LtGemm::Create();
  ASSERT_TRUE(created.ok()) << created.status();
  LtGemm& gemm = **created;
  const int64_t m = 64, n = 64, k = 32;
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> small_int(-2, 2);
  std::vector<bfloat16> a(m * k), b(n * k), z(m * n);  // b stored [n, k]: transpose_b
  for (bfloat16& e : a) e = ToBfloat16(static_cast<float>(small_int(rng)));
  for (bfloat16& e : b) e = ToBfloat16(static_cast<float>(small_int(rng)));
  for (int64_t i = 0; i < m * n; ++i) z[i] = ToBfloat16(static_cast<float>(4.0 * std::sin(0.91 * i + 0.3)));
  DeviceArray<bfloat16> a_dev(m * k), b_dev(n * k), z_dev(m * n), c_dev(m * n);
  for (auto* d : {&a_dev, &b_dev, &z_dev, &c_dev}) ASSERT_CUDA_OK(d->error());
  ASSERT_CUDA_OK(a_dev.Upload(a));
  ASSERT_CUDA_OK(b_dev.Upload(b));
  ASSERT_CUDA_OK(z_dev.Upload(z));
  auto* c = reinterpret_cast<__nv_bfloat16*>(c_dev.get());
  const auto* pa = reinterpret_cast<const __nv_bfloat16*>(a_dev.get());
  const auto* pb = reinterpret_cast<const __nv_bfloat16*>(b_dev.get());
  const auto* pz = reinterpret_cast<const __nv_bfloat16*>(z_dev.get());

  const absl::Status unaligned = gemm.MatmulGeluGrad(c, pa, pb, pz, m, 12, k, true, stream_);
  EXPECT_EQ(unaligned.code(), absl::StatusCode::kUnimplemented) << unaligned;
  const absl::Status empty = gemm.MatmulGeluGrad(c, pa, pb, pz, m, n, 0, true, stream_);
  EXPECT_EQ(empty.code(), absl::StatusCode::kUnimplemented) << empty;
  EXPECT_EQ(gemm.cached_plans(), 0u);
  EXPECT_TRUE(gemm.epilogue_fallbacks().empty());

  const absl::Status ran = gemm.MatmulGeluGrad(c, pa, pb, pz, m, n, k, true, stream_);
  EXPECT_TRUE(ran.ok() || ran.code() == absl::StatusCode::kUnimplemented) << ran;
  EXPECT_EQ(gemm.cached_plans(), 1u);
  std::printf("DGELU, bf16 a, b, D and aux: %s\n", ran.ok() ? "ran" : "no algorithm");
  RecordProperty("dgelu_bf16_ran", ran.ok() ? 1 : 0);
  EXPECT_EQ(gemm.epilogue_fallbacks().size(), ran.ok() ? 0u : 1u);
  for (const std::string& line : gemm.epilogue_fallbacks()) std::printf("  %s\n", line.c_str());
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  if (!ran.ok()) return;
  std::vector<bfloat16> got(m * n);
  ASSERT_CUDA_OK(c_dev.Download(&got));
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float product = 0;
      for (int64_t p = 0; p < k; ++p) product += ToFloat(a[i * k + p]) * ToFloat(b[j * k + p]);
      const float zf = ToFloat(z[i * n + j]);
      const double want = GeluTanhGradFn()(zf, product);
      const double du = 0.7978845608 * (1 + 3 * 0.044715 * zf * zf);
      const double bound = std::ldexp(1.0, -7) * std::abs(want) +
                           std::abs(product) * std::ldexp(1.0, -10) * (0.5 + std::abs(zf) * du) + 1e-6;
      const double g = ToFloat(got[i * n + j]);
      if (!(std::abs(g - want) <= bound) && bad++ < 5) {
        ADD_FAILURE() << "c[" << i << ", " << j << "]: " << g << ", want " << want << " (z " << zf << ", product "
                      << product << "), bound " << bound;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

// A training step calls the same shapes every step: the second call of a
// shape runs the plan of the first (no new descriptors, no heuristic) and
// gives the same bits; a new shape, transpose, alignment or type is a new plan.
TEST_F(CudaKernelsTest, GemmReusesThePlanOfAShapeItHasRun) {
  absl::StatusOr<std::unique_ptr<LtGemm>> created = LtGemm::Create();
  ASSERT_TRUE(created.ok()) << created.status();
  LtGemm& gemm = **created;
  EXPECT_EQ(gemm.cached_plans(), 0u);

  const int64_t m = 129, n = 67, k = 257;
  std::mt19937 rng(11);
  const std::vector<float> a = GemmInput<float>(m * k, /*integers=*/false, &rng);
  const std::vector<float> b = GemmInput<float>(k * n, /*integers=*/false, &rng);
  // One extra element each, so that the same arrays also serve as views off by one.
  DeviceArray<float> a_dev(m * k + 1), b_dev(k * n + 1), c_dev(m * n + 1);
  for (auto* d : {&a_dev, &b_dev, &c_dev}) ASSERT_CUDA_OK(d->error());
  ASSERT_CUDA_OK(a_dev.Upload(a));
  ASSERT_CUDA_OK(b_dev.Upload(b));

  auto run = [&](int64_t rows, bool transpose_b, float* c) {
    const absl::Status status = gemm.Matmul(c, a_dev.get(), b_dev.get(), rows, n, k, false, transpose_b, stream_);
    EXPECT_TRUE(status.ok()) << status;
  };
  std::vector<float> first(m * n), second(m * n);
  run(m, false, c_dev.get());
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  ASSERT_CUDA_OK(c_dev.Download(&first));
  EXPECT_EQ(gemm.cached_plans(), 1u);
  ASSERT_CUDA_OK(cudaMemset(c_dev.get(), 0xff, m * n * sizeof(float)));  // nan, so a skipped GEMM shows
  run(m, false, c_dev.get());
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  ASSERT_CUDA_OK(c_dev.Download(&second));
  EXPECT_EQ(gemm.cached_plans(), 1u) << "the same shape again made a new plan";
  EXPECT_TRUE(BitwiseEqual(second, first)) << "the cached plan gave other bits";
  const std::vector<float> expected = CpuMatmul<float>({m, n, k, false, false, false}, a, b);
  ASSERT_EQ(expected.size(), first.size());
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_NEAR(first[i], expected[i], 1e-3) << "c[" << i / n << ", " << i % n << "]";
  }

  run(m - 1, false, c_dev.get());  // another m
  EXPECT_EQ(gemm.cached_plans(), 2u);
  run(m, true, c_dev.get());  // b read as [n, k]
  EXPECT_EQ(gemm.cached_plans(), 3u);
  run(m, false, c_dev.get() + 1);  // c 4-byte aligned instead of 256
  EXPECT_EQ(gemm.cached_plans(), 4u);
  DeviceArray<bfloat16> a16(m * k), b16(k * n), c16(m * n);
  for (auto* d : {&a16, &b16, &c16}) ASSERT_CUDA_OK(d->error());
  ASSERT_CUDA_OK(cudaMemset(a16.get(), 0, m * k * sizeof(bfloat16)));
  ASSERT_CUDA_OK(cudaMemset(b16.get(), 0, k * n * sizeof(bfloat16)));
  const absl::Status bf16_status = gemm.Matmul(reinterpret_cast<__nv_bfloat16*>(c16.get()),
                                               reinterpret_cast<const __nv_bfloat16*>(a16.get()),
                                               reinterpret_cast<const __nv_bfloat16*>(b16.get()), m, n, k, false,
                                               false, stream_);
  EXPECT_TRUE(bf16_status.ok()) << bf16_status;
  EXPECT_EQ(gemm.cached_plans(), 5u) << "bf16 of the same shape needs its own plan";
  // Nothing for cuBLASLt to do: no plan.
  EXPECT_TRUE(gemm.Matmul(c_dev.get(), a_dev.get(), b_dev.get(), m, n, 0, false, false, stream_).ok());
  EXPECT_TRUE(gemm.Matmul(c_dev.get(), a_dev.get(), b_dev.get(), 0, n, k, false, false, stream_).ok());
  EXPECT_EQ(gemm.cached_plans(), 5u);

  run(m, false, c_dev.get());  // the first shape, after the others
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  ASSERT_CUDA_OK(c_dev.Download(&second));
  EXPECT_EQ(gemm.cached_plans(), 5u);
  EXPECT_TRUE(BitwiseEqual(second, first)) << "the first shape's plan, after four others";
}

TEST_F(CudaKernelsTest, LibrariesMatchTheirHeadersAndTheDriver) {
  const CudaVersions built = CompiledCudaVersions();
  const CudaVersions loaded = LoadedCudaVersions();
  EXPECT_EQ(loaded.runtime, built.runtime);
  // A driver runs runtimes of its own major version or older (13000 = 13.0).
  EXPECT_GE(loaded.driver / 1000, loaded.runtime / 1000) << "driver " << loaded.driver;
  EXPECT_EQ(loaded.cublaslt / 10000, built.cublaslt / 10000) << "cuBLASLt " << loaded.cublaslt;
  EXPECT_EQ(loaded.cudnn / 10000, built.cudnn / 10000) << "cuDNN " << loaded.cudnn;
  EXPECT_EQ(loaded.nccl / 10000, built.nccl / 10000) << "NCCL " << loaded.nccl;
  std::printf("%s", DescribeCuda().c_str());
}

TEST_F(CudaKernelsTest, CudnnOpensAHandleOnTheDevice) {
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = cudnnCreate(&handle);
  ASSERT_EQ(status, CUDNN_STATUS_SUCCESS) << cudnnGetErrorString(status);
  EXPECT_EQ(cudnnSetStream(handle, stream_), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnDestroy(handle), CUDNN_STATUS_SUCCESS);
}

// A one-rank communicator: allreduce is the identity, which checks that
// NCCL initialises and moves data on this device.
TEST_F(CudaKernelsTest, NcclAllReduceOnOneRankIsTheIdentity) {
  int device = 0;
  ASSERT_CUDA_OK(cudaGetDevice(&device));
  ncclComm_t comm = nullptr;
  const ncclResult_t init = ncclCommInitAll(&comm, 1, &device);
  ASSERT_EQ(init, ncclSuccess) << ncclGetErrorString(init);
  struct CommCloser {
    ncclComm_t comm;
    ~CommCloser() { ncclCommDestroy(comm); }
  } closer{comm};
  const std::vector<float> host = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f};
  DeviceArray<float> send(host.size()), recv(host.size());
  ASSERT_CUDA_OK(send.error());
  ASSERT_CUDA_OK(recv.error());
  ASSERT_CUDA_OK(send.Upload(host));
  const ncclResult_t reduce = ncclAllReduce(send.get(), recv.get(), host.size(), ncclFloat32, ncclSum, comm, stream_);
  EXPECT_EQ(reduce, ncclSuccess) << ncclGetErrorString(reduce);
  ASSERT_CUDA_OK(cudaStreamSynchronize(stream_));
  std::vector<float> out(host.size());
  ASSERT_CUDA_OK(recv.Download(&out));
  EXPECT_EQ(out, host);
}

}  // namespace
}  // namespace cuda
}  // namespace strata
