// cast: y = x converted to the `dtype` attr. One kernel per source dtype; the
// destination is chosen once at prepare time.
// Threads: UnaryMap splits the flat element range into contiguous chunks.

#include <type_traits>

#include "kernels/cpu/elementwise.h"
#include "kernels/kernel_checks.h"
#include "kernels/cuda/unary_math.h"

namespace strata {
namespace {

// The conversion (kernels/cuda/unary_math.h, shared with the CUDA kernel):
// floating to integer truncates toward zero, saturates and maps nan to 0;
// 16-bit floats go through float32.
using cuda::Convert;

template <typename S, typename D>
class CastKernel : public OpKernel {
 public:
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if constexpr (std::is_same_v<S, D>) {
      ctx.SetOutput(0, x);  // same dtype: share the buffer
      return absl::OkStatus();
    }
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, DataTypeOf<D>::value, x.shape());
    if (!y.ok()) return y.status();
    UnaryMap(x.num_elements(), x.data<S>(), (*y)->data<D>(), [](S v) { return Convert<D>(v); });
    return absl::OkStatus();
  }
};

template <typename S>
absl::StatusOr<std::unique_ptr<OpKernel>> CreateCast(const KernelDef& def) {
  absl::StatusOr<DataType> dtype = kernel_checks::CastTarget(*def.op);
  if (!dtype.ok()) return dtype.status();
  switch (*dtype) {
    case F32: return std::unique_ptr<OpKernel>(new CastKernel<S, float>());
    case F64: return std::unique_ptr<OpKernel>(new CastKernel<S, double>());
    case I64: return std::unique_ptr<OpKernel>(new CastKernel<S, int64_t>());
    case I32: return std::unique_ptr<OpKernel>(new CastKernel<S, int32_t>());
    case BOOL: return std::unique_ptr<OpKernel>(new CastKernel<S, bool>());
    case BF16: return std::unique_ptr<OpKernel>(new CastKernel<S, bfloat16>());
    case F16: return std::unique_ptr<OpKernel>(new CastKernel<S, float16>());
    default: break;
  }
  return absl::InternalError("cast: CastTarget returned a dtype cast does not convert to");
}

STRATA_REGISTER_KERNEL("cast", DEVICE_CPU, F32, CreateCast<float>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CPU, F64, CreateCast<double>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CPU, I64, CreateCast<int64_t>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CPU, I32, CreateCast<int32_t>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CPU, BOOL, CreateCast<bool>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CPU, BF16, CreateCast<bfloat16>);
STRATA_REGISTER_KERNEL("cast", DEVICE_CPU, F16, CreateCast<float16>);

}  // namespace
}  // namespace strata
