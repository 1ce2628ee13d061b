#ifndef STRATA_KERNELS_CUDA_UNARY_MATH_H_
#define STRATA_KERNELS_CUDA_UNARY_MATH_H_

// The per-element math of the unary ops, their backward helpers and cast, as
// __host__ __device__ functors: the CPU kernels (kernels/cpu/unary.cc,
// activations.cc, cast.cc) call them through UnaryMap / BinaryMap, and the
// CUDA kernels (kernels/cuda/unary.cu) through one grid-stride launcher, so
// each formula is written once. The .cu files are built with --fmad=false,
// so the pure IEEE arithmetic (neg, square, sqrt, scale, the *_grad of sqrt,
// tanh and sigmoid, cast) rounds as on the CPU. What can differ is the
// transcendentals: CUDA's expf/logf/tanhf/erff (and the double ones) are
// within a few ulp of the exact value, as glibc's are, but not the same few.

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/cuda/kernel_math.h"
#include "runtime/float16.h"

namespace strata {
namespace cuda {

using kernel_math::Erf;
using kernel_math::Exp;
using kernel_math::Log;
using kernel_math::Tanh;

// ---------------------------------------------------------------------------
// y = f(x): exp, log, sqrt, square, neg, scale (kernels/cpu/unary.cc).

struct ExpFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    return Exp(x);
  }
};
struct LogFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    return Log(x);
  }
};
struct SqrtFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    return Sqrt(x);
  }
};
struct SquareFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    return x * x;
  }
};
struct NegFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    return -x;
  }
};
// y = scale * x + bias (two roundings: no FMA on either side).
template <typename T>
struct ScaleFn {
  T scale, bias;
  STRATA_HOST_DEVICE T operator()(T x) const { return scale * x + bias; }
};

// gelu (both forms), tanh, sigmoid (kernels/cpu/activations.cc).

// The exact (erf) form, torch.nn.functional.gelu's default.
struct GeluFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    return T(0.5) * x * (T(1) + Erf(x * T(M_SQRT1_2)));
  }
};
// The tanh form (gelu's approximate "tanh"): PyTorch's
// F.gelu(approximate='tanh'), GPT-2's gelu_new, and what cuBLASLt's GELU
// epilogue computes. Written as PyTorch's CPU kernel writes it.
inline constexpr double kGeluTanhBeta = M_SQRT2 * M_2_SQRTPI * 0.5;  // sqrt(2 / pi)
inline constexpr double kGeluTanhKappa = 0.044715;
struct GeluTanhFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    const T inner = T(kGeluTanhBeta) * (x + T(kGeluTanhKappa) * (x * x * x));
    return T(0.5) * x * (T(1) + Tanh(inner));
  }
};
struct TanhFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    return Tanh(x);
  }
};
// Never exponentiates a large positive number, so no overflow to inf/inf.
struct SigmoidFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x) const {
    if (x >= T(0)) return T(1) / (T(1) + Exp(-x));
    const T e = Exp(x);
    return e / (T(1) + e);
  }
};

// ---------------------------------------------------------------------------
// dx = f(a, dy), a being the op's input (gelu) or output (the others).

struct SqrtGradFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T y, T dy) const {
    return dy * T(0.5) / y;
  }
};
// d/dx [x Phi(x)] = Phi(x) + x phi(x), phi(x) = exp(-x^2 / 2) / sqrt(2 pi).
struct GeluGradFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x, T dy) const {
    const T cdf = T(0.5) * (T(1) + Erf(x * T(M_SQRT1_2)));
    const T pdf = Exp(T(-0.5) * x * x) * T(0.5 * M_2_SQRTPI * M_SQRT1_2);
    return dy * (cdf + x * pdf);
  }
};
// The tanh form's derivative: with t = tanh(u), u = beta (x + kappa x^3),
// 0.5 (1 + t) + 0.5 x (1 - t^2) beta (1 + 3 kappa x^2), as PyTorch writes it.
struct GeluTanhGradFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T x, T dy) const {
    const T x_sq = x * x;
    const T inner = T(kGeluTanhBeta) * (x + T(kGeluTanhKappa) * (x_sq * x));
    const T t = Tanh(inner);
    const T left = T(0.5) * x;
    const T right = T(1) + t;
    const T left_derivative = T(0.5) * right;
    const T right_derivative = left * (T(1) - t * t);
    const T inner_derivative = T(kGeluTanhBeta) * (T(1) + T(3 * kGeluTanhKappa) * x_sq);
    return dy * (left_derivative + right_derivative * inner_derivative);
  }
};
struct TanhGradFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T y, T dy) const {
    return dy * (T(1) - y * y);
  }
};
struct SigmoidGradFn {
  template <typename T>
  STRATA_HOST_DEVICE T operator()(T y, T dy) const {
    return dy * y * (T(1) - y);
  }
};

// ---------------------------------------------------------------------------
// cast (kernels/cpu/cast.cc): D from S.

template <typename T>
inline constexpr bool kIsHalf = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// An integer type's range as constants (device code may read a constexpr
// variable, not call numeric_limits' host functions).
template <typename D>
inline constexpr D kIntMin = std::numeric_limits<D>::min();
template <typename D>
inline constexpr D kIntMax = std::numeric_limits<D>::max();

// Floating to integer truncates toward zero, saturates, and maps nan to 0:
// a plain static_cast would be undefined behaviour out of range. 16-bit
// floats go through float32 (runtime/float16.h rounds to nearest even).
template <typename D, typename S>
STRATA_HOST_DEVICE D Convert(S v) {
  if constexpr (kIsHalf<S>) {
    return Convert<D>(ToFloat(v));
  } else if constexpr (std::is_same_v<D, bfloat16>) {
    return ToBfloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, float16>) {
    return ToFloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_floating_point_v<S> && std::is_integral_v<D>) {
    if (v != v) return D(0);  // nan
    if (v <= static_cast<S>(kIntMin<D>)) return kIntMin<D>;
    if (v >= static_cast<S>(kIntMax<D>)) return kIntMax<D>;
    return static_cast<D>(v);
  } else {
    return static_cast<D>(v);
  }
}

template <typename D>
struct ConvertFn {
  template <typename S>
  STRATA_HOST_DEVICE D operator()(S v) const {
    return Convert<D>(v);
  }
};

}  // namespace cuda
}  // namespace strata

#endif  // STRATA_KERNELS_CUDA_UNARY_MATH_H_
