#ifndef STRATA_KERNELS_CUDA_CUDA_OP_TEST_UTIL_H_
#define STRATA_KERNELS_CUDA_CUDA_OP_TEST_UTIL_H_

// What every test of the registered CUDA kernels needs: a fixture that runs
// an op on the CPU and on a CudaDevice from the same host inputs (the kernel
// registry by (op, device kind, dtype), the op's shape function, outputs from
// the device's caching allocator), random inputs, a bit-for-bit comparison,
// and the list of ops each test file covers. The test files of
// //kernels/cuda:cuda_ops_test each add their ops to that list with
// STRATA_CUDA_OPS_TESTED; cuda_ops_test.cc checks that every op with a CUDA
// kernel is on it. Tagged gpu: without a CUDA device every test FAILS.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "proto/program.pb.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace testing {

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override;

  // Runs `op` on the CPU and on the GPU from the same host inputs; returns
  // (cpu, gpu) outputs "y", the GPU's copied back to the host.
  std::pair<Tensor, Tensor> RunBoth(const std::string& op_text, const std::map<std::string, Tensor>& inputs);

  // The same for the named outputs, with run.total_steps set on both sides.
  // The CPU runs on copies of the inputs, so ops that update in place leave
  // `inputs` as they were.
  std::vector<std::pair<Tensor, Tensor>> RunBothNamed(const std::string& op_text,
                                                      const std::map<std::string, Tensor>& inputs,
                                                      const std::vector<std::string>& outputs, int64_t total_steps = 0);

  // Runs `op` on the GPU only; output `output` copied to the host.
  Tensor RunGpu(const std::string& op_text, const std::map<std::string, Tensor>& inputs,
                const std::string& output = "y");

  std::unique_ptr<CudaDevice> device_;
  RunContext gpu_;
};

// Runs the registered kernel for (op, run's device kind, dtype) on `inputs`
// directly, past the op's shape function: what a kernel does with operands
// the compiler would have refused, or a dtype the schema does not take yet.
absl::StatusOr<Tensor> RunKernel(const Op& op, DataType dtype, const std::vector<const Tensor*>& inputs,
                                 const RunContext& run);

// n doubles uniform in [-2, 2).
std::vector<double> Uniform(int64_t n, uint32_t seed);
// n integer-valued doubles in [-1000, 1000], for I64 tensors.
std::vector<double> Integers(int64_t n, uint32_t seed);
// A host tensor of `dtype`: Integers for I64, Uniform otherwise.
Tensor RandomTensor(DataType dtype, const Shape& shape, uint32_t seed);

// Same dtype, shape and bits.
::testing::AssertionResult BitEqual(const Tensor& a, const Tensor& b);

// |t| elementwise, in F64.
Tensor AbsF64(const Tensor& t);

// |gpu - cpu| <= tol * magnitude + 1e-6 for every element: the error bound
// of a GEMM or a sum computed in another order, `magnitude` being the same
// op on the inputs' absolute values (sum |terms| per element). Names the
// first element over it.
::testing::AssertionResult WithinErrorBound(const Tensor& gpu, const Tensor& cpu, const Tensor& magnitude, double tol);

// The kernel of `op_text` for `dtype`, run directly (past the shape
// function) on the host `inputs` on the CPU and on copies of them on `gpu`'s
// device: both must refuse, with the same code and words.
void ExpectSameRefusal(const std::string& op_text, DataType dtype, const std::vector<const Tensor*>& inputs,
                       const RunContext& gpu);
void ExpectSameRefusal(const std::string& op_text, DataType dtype, const std::vector<Tensor>& inputs,
                       const RunContext& gpu);

// The ops the linked test files cover, with the dtypes each registers for
// DEVICE_CUDA.
std::map<std::string, std::vector<DataType>>& TestedCudaKernels();

// Ops that two STRATA_CUDA_OPS_TESTED list (cuda_ops_test.cc fails on any).
std::vector<std::string>& TestedTwice();

struct CudaOpsTested {
  CudaOpsTested(std::initializer_list<std::pair<const std::string, std::vector<DataType>>> ops);
};

}  // namespace testing
}  // namespace strata

// At namespace scope in a test file: the ops (with their CUDA dtypes) that
// the file tests, e.g.
//   STRATA_CUDA_OPS_TESTED(gelu, {{"gelu", {F32, BF16}}, {"gelu_grad",
//   {F32}}});
#define STRATA_CUDA_OPS_TESTED(tag, ...) \
  static const ::strata::testing::CudaOpsTested strata_cuda_ops_tested_##tag(__VA_ARGS__)

#endif  // STRATA_KERNELS_CUDA_CUDA_OP_TEST_UTIL_H_
