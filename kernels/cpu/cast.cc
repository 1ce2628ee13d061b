// cast: y = x converted to the `dtype` attr. One kernel per source dtype; the
// destination is chosen once at prepare time.
// Threads: UnaryMap splits the flat element range into contiguous chunks.

#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/cpu/elementwise.h"

namespace strata {
namespace {

template <typename T>
constexpr bool kIsHalf = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// Floating to integer truncates toward zero, saturates, and maps nan to 0:
// a plain static_cast would be undefined behaviour out of range. 16-bit
// floats go through float32 (runtime/float16.h rounds to nearest even).
template <typename D, typename S>
D Convert(S v) {
  if constexpr (kIsHalf<S>) {
    return Convert<D>(ToFloat(v));
  } else if constexpr (std::is_same_v<D, bfloat16>) {
    return ToBfloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, float16>) {
    return ToFloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    if (std::isnan(v)) return D(0);
    if (v <= static_cast<S>(std::numeric_limits<D>::min())) return std::numeric_limits<D>::min();
    if (v >= static_cast<S>(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
    return static_cast<D>(v);
  } else {
    return static_cast<D>(v);
  }
}

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
  absl::StatusOr<std::string> name = AttrString(*def.op, "dtype");
  if (!name.ok()) return name.status();
  DataType dtype = DT_INVALID;
  DataType_Parse(*name, &dtype);
  switch (dtype) {
    case F32: return std::unique_ptr<OpKernel>(new CastKernel<S, float>());
    case F64: return std::unique_ptr<OpKernel>(new CastKernel<S, double>());
    case I64: return std::unique_ptr<OpKernel>(new CastKernel<S, int64_t>());
    case I32: return std::unique_ptr<OpKernel>(new CastKernel<S, int32_t>());
    case BOOL: return std::unique_ptr<OpKernel>(new CastKernel<S, bool>());
    case BF16: return std::unique_ptr<OpKernel>(new CastKernel<S, bfloat16>());
    case F16: return std::unique_ptr<OpKernel>(new CastKernel<S, float16>());
    default: break;
  }
  return absl::InvalidArgumentError(absl::StrCat("cast: unknown dtype '", *name, "'"));
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
