// CUDA kernels of math ops: add, sub, mul, div with numpy broadcasting
// (kernels/cuda/binary.cu), sum_to_like (kernels/cuda/reduce.cu) and
// fill_like (kernels/cuda/fill.cu). Shape checks, errors and the
// buffer-sharing cases are the CPU kernels' (kernels/cpu/binary.cc,
// reduce.cc, utility.cc); only the loops run on the device.

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/broadcast_plan.h"
#include "kernels/cuda/binary.h"
#include "kernels/cuda/fill.h"
#include "kernels/cuda/reduce.h"
#include "proto/shape_rules.h"
#include "proto/status_macros.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

const char* BinaryOpName(cuda::BinaryOp op) {
  switch (op) {
    case cuda::BinaryOp::kAdd: return "add";
    case cuda::BinaryOp::kSub: return "sub";
    case cuda::BinaryOp::kMul: return "mul";
    case cuda::BinaryOp::kDiv: return "div";
  }
  return "binary";
}

// z = x op y. Same shapes (after the plan's merging: one contiguous run for
// both inputs) take the flat kernel; anything else the strided one.
template <typename T, cuda::BinaryOp kOp>
class CudaBinaryKernel : public OpKernel {
 public:
  explicit CudaBinaryKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const Tensor& y = ctx.input(1);
    STRATA_ASSIGN_OR_RETURN(BroadcastPlan plan, MakeBroadcastPlan(x.shape(), y.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * z, ctx.AllocateOutput(0, DataTypeOf<T>::value, plan.out_shape));
    const int64_t n = z->num_elements();
    if (n == 0) return absl::OkStatus();
    if (plan.outer_count == 1 && plan.inner_x_stride == 1 && plan.inner_y_stride == 1) {
      return CudaStatus(
          cuda::LaunchBinarySameShape(kOp, z->data<T>(), x.data<T>(), y.data<T>(), n, device->stream()),
          BinaryOpName(kOp));
    }
    cuda::BroadcastStrides s;
    s.rank = static_cast<int>(plan.outer_dims.size()) + 1;
    if (s.rank > cuda::kMaxBroadcastDims) {
      return absl::UnimplementedError(absl::StrCat(BinaryOpName(kOp), ": x ", ShapeString(x.shape()), " and y ",
                                                   ShapeString(y.shape()), " broadcast over ", s.rank,
                                                   " dims after merging; the CUDA kernel takes at most ",
                                                   cuda::kMaxBroadcastDims));
    }
    for (int d = 0; d + 1 < s.rank; ++d) {
      s.dims[d] = plan.outer_dims[d];
      s.x_strides[d] = plan.outer_x_strides[d];
      s.y_strides[d] = plan.outer_y_strides[d];
    }
    s.dims[s.rank - 1] = plan.inner;
    s.x_strides[s.rank - 1] = plan.inner_x_stride;
    s.y_strides[s.rank - 1] = plan.inner_y_stride;
    return CudaStatus(
        cuda::LaunchBinaryBroadcast(kOp, z->data<T>(), x.data<T>(), y.data<T>(), n, s, device->stream()),
        BinaryOpName(kOp));
  }
};

// y = x summed over the dims along which `like` broadcasts to x; the checks
// and messages are kernels/cpu/reduce.cc's.
template <typename T>
class CudaSumToLikeKernel : public OpKernel {
 public:
  explicit CudaSumToLikeKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    const Shape& like = ctx.input(1).shape();
    bool any = false;
    STRATA_ASSIGN_OR_RETURN(const std::vector<bool> reduced, SumToLikeDims(x.shape(), like, &any));
    if (!any) {
      ctx.SetOutput(0, x.Reshaped(like));  // nothing was broadcast: share the buffer
      return absl::OkStatus();
    }
    cuda::ReducePlan plan;
    if (!cuda::MakeReducePlan(x.rank(), x.shape().data(), reduced, &plan)) {
      return absl::UnimplementedError(absl::StrCat("sum_to_like: x ", ShapeString(x.shape()), " to like ",
                                                   ShapeString(like), " alternates kept and summed dims more than ",
                                                   cuda::kMaxReduceDims, " times; the CUDA kernel does not"));
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<T>::value, like));
    return CudaStatus(cuda::LaunchReduceSum(y->data<T>(), x.data<T>(), plan, device->stream()), "sum_to_like");
  }
};

// y = x's type filled with attr `value`, converted to the dtype on the host
// exactly as Tensor::Fill converts it on the CPU.
class CudaFillLikeKernel : public OpKernel {
 public:
  explicit CudaFillLikeKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    STRATA_ASSIGN_OR_RETURN(value_, AttrFloat(op, "value"));
    return absl::OkStatus();
  }
  absl::Status Compute(KernelContext& ctx) override {
    STRATA_ASSIGN_OR_RETURN(CudaDevice * device, CudaDeviceOf(ctx));
    const Tensor& x = ctx.input(0);
    if (x.dtype() != bits_dtype_) {
      Tensor one = Tensor::Empty(x.dtype(), Shape{}, GetCpuAllocator());
      if (!one.defined()) return absl::ResourceExhaustedError("fill_like: out of host memory");
      one.Fill(value_);
      bits_ = 0;
      std::memcpy(&bits_, one.raw_data(), one.bytes());
      bits_dtype_ = x.dtype();
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    return CudaStatus(cuda::LaunchFill(y->raw_data(), static_cast<int>(DataTypeSize(x.dtype())), bits_,
                                       y->num_elements(), device->stream()),
                      "fill_like");
  }

 private:
  double value_ = 1.0;
  DataType bits_dtype_ = DT_INVALID;
  uint64_t bits_ = 0;
};

using cuda::BinaryOp;
STRATA_REGISTER_KERNEL("add", DEVICE_CUDA, F32, (MakeFactory<CudaBinaryKernel<float, BinaryOp::kAdd>>()));
STRATA_REGISTER_KERNEL("add", DEVICE_CUDA, F64, (MakeFactory<CudaBinaryKernel<double, BinaryOp::kAdd>>()));
STRATA_REGISTER_KERNEL("add", DEVICE_CUDA, I64, (MakeFactory<CudaBinaryKernel<int64_t, BinaryOp::kAdd>>()));
STRATA_REGISTER_KERNEL("sub", DEVICE_CUDA, F32, (MakeFactory<CudaBinaryKernel<float, BinaryOp::kSub>>()));
STRATA_REGISTER_KERNEL("sub", DEVICE_CUDA, F64, (MakeFactory<CudaBinaryKernel<double, BinaryOp::kSub>>()));
STRATA_REGISTER_KERNEL("sub", DEVICE_CUDA, I64, (MakeFactory<CudaBinaryKernel<int64_t, BinaryOp::kSub>>()));
STRATA_REGISTER_KERNEL("mul", DEVICE_CUDA, F32, (MakeFactory<CudaBinaryKernel<float, BinaryOp::kMul>>()));
STRATA_REGISTER_KERNEL("mul", DEVICE_CUDA, F64, (MakeFactory<CudaBinaryKernel<double, BinaryOp::kMul>>()));
STRATA_REGISTER_KERNEL("mul", DEVICE_CUDA, I64, (MakeFactory<CudaBinaryKernel<int64_t, BinaryOp::kMul>>()));
// Floating only, as on the CPU.
STRATA_REGISTER_KERNEL("div", DEVICE_CUDA, F32, (MakeFactory<CudaBinaryKernel<float, BinaryOp::kDiv>>()));
STRATA_REGISTER_KERNEL("div", DEVICE_CUDA, F64, (MakeFactory<CudaBinaryKernel<double, BinaryOp::kDiv>>()));
STRATA_REGISTER_KERNEL("sum_to_like", DEVICE_CUDA, F32, MakeFactory<CudaSumToLikeKernel<float>>());
STRATA_REGISTER_KERNEL("sum_to_like", DEVICE_CUDA, F64, MakeFactory<CudaSumToLikeKernel<double>>());
STRATA_REGISTER_KERNEL("sum_to_like", DEVICE_CUDA, I64, MakeFactory<CudaSumToLikeKernel<int64_t>>());
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CUDA, F32, InitFactory<CudaFillLikeKernel>());
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CUDA, F64, InitFactory<CudaFillLikeKernel>());
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CUDA, I64, InitFactory<CudaFillLikeKernel>());
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CUDA, I32, InitFactory<CudaFillLikeKernel>());
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CUDA, BOOL, InitFactory<CudaFillLikeKernel>());
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CUDA, BF16, InitFactory<CudaFillLikeKernel>());
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CUDA, F16, InitFactory<CudaFillLikeKernel>());

}  // namespace
}  // namespace strata
