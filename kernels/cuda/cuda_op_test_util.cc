#include "kernels/cuda/cuda_op_test_util.h"

#include <cmath>
#include <cstring>
#include <random>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "compiler/testing/op_test_util.h"
#include "runtime/cuda/cuda_test_util.h"

namespace strata {
namespace testing {

void CudaOpsTest::SetUp() {
  device_ = CudaDeviceOrFail();
  ASSERT_NE(device_, nullptr);
  gpu_.device = device_.get();
}

std::pair<Tensor, Tensor> CudaOpsTest::RunBoth(const std::string& op_text,
                                               const std::map<std::string, Tensor>& inputs) {
  std::vector<std::pair<Tensor, Tensor>> out = RunBothNamed(op_text, inputs, {"y"});
  return out.empty() ? std::pair<Tensor, Tensor>() : out[0];
}

std::vector<std::pair<Tensor, Tensor>> CudaOpsTest::RunBothNamed(const std::string& op_text,
                                                                 const std::map<std::string, Tensor>& inputs,
                                                                 const std::vector<std::string>& outputs,
                                                                 int64_t total_steps) {
  std::map<std::string, Tensor> cpu_env, gpu_env;
  for (const auto& [name, t] : inputs) {
    cpu_env[name] = t.Clone(GetCpuAllocator());
    absl::StatusOr<Tensor> on_gpu = t.CopyTo(device_.get());
    EXPECT_TRUE(on_gpu.ok()) << on_gpu.status();
    gpu_env[name] = on_gpu.ok() ? *on_gpu : Tensor();
  }
  const Op op = ParseOp(op_text);
  RunContext cpu_run, gpu_run = gpu_;
  cpu_run.total_steps = gpu_run.total_steps = total_steps;
  const absl::Status cpu = RunOp(op, &cpu_env, cpu_run);
  const absl::Status gpu = RunOp(op, &gpu_env, gpu_run);
  EXPECT_TRUE(cpu.ok()) << op_text << ": " << cpu;
  EXPECT_TRUE(gpu.ok()) << op_text << ": " << gpu;
  if (!cpu.ok() || !gpu.ok()) return {};
  std::vector<std::pair<Tensor, Tensor>> result;
  for (const std::string& name : outputs) {
    EXPECT_EQ(gpu_env.at(name).device(), device_.get()) << name << " lives on the GPU";
    result.emplace_back(cpu_env.at(name), gpu_env.at(name).Clone(GetCpuAllocator()));
  }
  const absl::Status sync = device_->Synchronize();
  EXPECT_TRUE(sync.ok()) << op_text << ": " << sync;
  return result;
}

Tensor CudaOpsTest::RunGpu(const std::string& op_text, const std::map<std::string, Tensor>& inputs,
                           const std::string& output) {
  std::map<std::string, Tensor> env;
  for (const auto& [name, t] : inputs) env[name] = *t.CopyTo(device_.get());
  const absl::Status s = RunOp(ParseOp(op_text), &env, gpu_);
  EXPECT_TRUE(s.ok()) << op_text << ": " << s;
  if (!s.ok()) return Tensor();
  Tensor host = env.at(output).Clone(GetCpuAllocator());
  const absl::Status sync = device_->Synchronize();
  EXPECT_TRUE(sync.ok()) << sync;
  return host;
}

absl::StatusOr<Tensor> RunKernel(const Op& op, DataType dtype, const std::vector<const Tensor*>& inputs,
                                 const RunContext& run) {
  const KernelFactory* factory = KernelRegistry::Global().Find(op.type(), run.device->kind(), dtype);
  if (factory == nullptr) return absl::NotFoundError(absl::StrCat("no kernel for ", op.type()));
  // The schema's default attrs, as the compiler gives every op before a
  // kernel sees it (kernels read their attrs without defaults).
  const OpSchema* schema = OpRegistry::Global().Find(op.type());
  if (schema == nullptr) return absl::NotFoundError(absl::StrCat("unknown op type '", op.type(), "'"));
  Op canonical = op;
  if (absl::Status s = CanonicalizeOp(*schema, &canonical); !s.ok()) return s;
  KernelDef def;
  def.op = &canonical;
  auto kernel = (*factory)(def);
  if (!kernel.ok()) return kernel.status();
  std::vector<Tensor> outputs(canonical.output_size());  // the kernel may write each; the first is returned
  KernelContext ctx(&run, inputs, absl::MakeSpan(outputs));
  if (absl::Status s = (*kernel)->Compute(ctx); !s.ok()) return s;
  return outputs[0];
}

std::vector<double> Uniform(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

std::vector<double> Integers(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-1000, 1000);
  std::vector<double> v(n);
  for (double& x : v) x = u(rng);
  return v;
}

Tensor RandomTensor(DataType dtype, const Shape& shape, uint32_t seed) {
  return MakeTensor(dtype, shape,
                    dtype == I64 ? Integers(NumElements(shape), seed) : Uniform(NumElements(shape), seed));
}

::testing::AssertionResult BitEqual(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    return ::testing::AssertionFailure() << TypeOf(a).ToString() << " vs " << TypeOf(b).ToString();
  }
  if (a.bytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.bytes()) == 0) return ::testing::AssertionSuccess();
  // NaN payloads and signs are not compared: IEEE 754 leaves them open, the
  // CPU's arithmetic passes an input NaN's bits through and CUDA's returns
  // its canonical NaN. Every other element must match bit for bit.
  const int64_t n = NumElements(a.shape());
  const size_t width = a.bytes() / static_cast<size_t>(n);
  const bool floating = a.dtype() != I64 && a.dtype() != I32 && a.dtype() != BOOL;
  const std::vector<double> va = floating ? TensorValues(a) : std::vector<double>(),
                            vb = floating ? TensorValues(b) : std::vector<double>();
  const auto* pa = static_cast<const unsigned char*>(a.raw_data());
  const auto* pb = static_cast<const unsigned char*>(b.raw_data());
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(pa + i * width, pb + i * width, width) == 0) continue;
    if (floating && std::isnan(va[i]) && std::isnan(vb[i])) continue;
    return ::testing::AssertionFailure() << "the bits differ at element " << i << ": " << a.DebugString(8) << " vs "
                                         << b.DebugString(8);
  }
  return ::testing::AssertionSuccess();
}

Tensor AbsF64(const Tensor& t) {
  std::vector<double> v = TensorValues(t);
  for (double& x : v) x = std::fabs(x);
  return MakeTensor(F64, t.shape(), v);
}

::testing::AssertionResult WithinErrorBound(const Tensor& gpu, const Tensor& cpu, const Tensor& magnitude, double tol) {
  if (gpu.dtype() != cpu.dtype() || gpu.shape() != cpu.shape() || magnitude.shape() != cpu.shape()) {
    return ::testing::AssertionFailure() << TypeOf(gpu).ToString() << " vs " << TypeOf(cpu).ToString()
                                         << ", magnitude " << ShapeString(magnitude.shape());
  }
  const std::vector<double> g = TensorValues(gpu), c = TensorValues(cpu), m = TensorValues(magnitude);
  for (size_t i = 0; i < g.size(); ++i) {
    const double bar = tol * m[i] + 1e-6;
    if (!(std::fabs(g[i] - c[i]) <= bar)) {
      return ::testing::AssertionFailure() << "element " << i << ": gpu " << g[i] << " cpu " << c[i] << " bar " << bar;
    }
  }
  return ::testing::AssertionSuccess();
}

void ExpectSameRefusal(const std::string& op_text, DataType dtype, const std::vector<const Tensor*>& inputs,
                       const RunContext& gpu) {
  SCOPED_TRACE(op_text);
  const Op op = ParseOp(op_text);
  std::vector<Tensor> copies;
  for (const Tensor* t : inputs) {
    absl::StatusOr<Tensor> copy = t->CopyTo(gpu.device);
    ASSERT_TRUE(copy.ok()) << copy.status();
    copies.push_back(*std::move(copy));
  }
  std::vector<const Tensor*> on_device;
  for (const Tensor& t : copies) on_device.push_back(&t);
  const absl::StatusOr<Tensor> cpu_result = RunKernel(op, dtype, inputs, RunContext());
  const absl::StatusOr<Tensor> gpu_result = RunKernel(op, dtype, on_device, gpu);
  ASSERT_FALSE(cpu_result.ok());
  ASSERT_FALSE(gpu_result.ok());
  EXPECT_EQ(gpu_result.status(), cpu_result.status());
}

void ExpectSameRefusal(const std::string& op_text, DataType dtype, const std::vector<Tensor>& inputs,
                       const RunContext& gpu) {
  std::vector<const Tensor*> pointers;
  for (const Tensor& t : inputs) pointers.push_back(&t);
  ExpectSameRefusal(op_text, dtype, pointers, gpu);
}

std::map<std::string, std::vector<DataType>>& TestedCudaKernels() {
  static auto* tested = new std::map<std::string, std::vector<DataType>>;
  return *tested;
}

std::vector<std::string>& TestedTwice() {
  static auto* twice = new std::vector<std::string>;
  return *twice;
}

CudaOpsTested::CudaOpsTested(std::initializer_list<std::pair<const std::string, std::vector<DataType>>> ops) {
  for (const auto& [op, dtypes] : ops) {
    if (!TestedCudaKernels().emplace(op, dtypes).second) TestedTwice().push_back(op);
  }
}

}  // namespace testing
}  // namespace strata
