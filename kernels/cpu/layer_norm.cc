// layer_norm over the last dim and its backward, which recomputes each row's
// mean and rstd from x instead of keeping them (one less saved tensor).
//
// Threads: parallel over rows. The backward's dgamma/dbeta are summed per
// fixed block of rows (nn_kernels::LayerNormGradRowsPerBlock, kernels/work_split.h:
// set by the shape only, so the summation order is the same on any thread
// count and on the GPU), then over blocks in order.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/base/attributes.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/cuda/unary_math.h"
#include "kernels/kernel_checks.h"
#include "kernels/work_split.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using nn_kernels::InitFactory;
using nn_kernels::MinChunk;
using nn_kernels::Scratch;

// Sum over j < d of f(j) in double, in 8 independent lanes so the compiler
// can vectorize it (a single accumulator is a serial dependency chain).
// Inlined always, so that each ISA clone of the rows below compiles it for
// its own ISA.
template <typename F>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline double LaneSum(int64_t d, const F& f) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= d; j += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += f(j + k);
  }
  double tail = 0;
  for (; j < d; ++j) tail += f(j);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + tail;
}

// Mean and 1/sqrt(biased variance + epsilon) of one row (two passes, in double).
template <typename T>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void RowMoments(const T* x, int64_t d, double epsilon, double* mean, double* rstd) {
  const double m = LaneSum(d, [x](int64_t j) { return static_cast<double>(x[j]); }) / d;
  const double sq = LaneSum(d, [x, m](int64_t j) {
    const double c = x[j] - m;
    return c * c;
  });
  *mean = m;
  *rstd = 1.0 / std::sqrt(sq / d + epsilon);
}

// Base of layer_norm and its backward: reads epsilon.
using LayerNormBase = EpsilonAttrKernel;

// One row of each kernel, over pointers that do not overlap (__restrict, so
// the element loops vectorize), compiled for AVX-512, AVX2 and the baseline
// (STRATA_ISA_CLONES, elementwise.h): the same IEEE operations in the same
// order on each, with no FMA contraction, so every clone computes the
// baseline's bits (layer_norm_test.RowsEqualTheScalarFormulasBitForBit).

// y = (x - mean) * rstd * gamma + beta in T, stored as Y.
template <typename T, typename Y>
static STRATA_ISA_CLONES void ForwardRow(int64_t D, double eps, const T* __restrict x, const T* __restrict gamma,
                                         const T* __restrict beta, Y* __restrict y) {
  double mean, rstd;
  RowMoments(x, D, eps, &mean, &rstd);
  const T m = static_cast<T>(mean), rs = static_cast<T>(rstd);
  for (int64_t j = 0; j < D; ++j) y[j] = cuda::Convert<Y>((x[j] - m) * rs * gamma[j] + beta[j]);
}

// dx (and dx_low, unless L is T: then it is null) of one row, its dgamma and
// dbeta terms added to the block's; res (optional) is added to dx in T.
template <typename T, typename DY, typename L>
static STRATA_ISA_CLONES void GradRow(int64_t D, double eps, const T* __restrict x, const T* __restrict gamma,
                                      const DY* __restrict dy, const T* __restrict res, T* __restrict dx,
                                      L* __restrict dx_low, double* __restrict dgamma, double* __restrict dbeta) {
  double mean, rstd;
  RowMoments(x, D, eps, &mean, &rstd);
  const auto dy_at = [dy](int64_t j) { return static_cast<double>(cuda::Convert<T>(dy[j])); };
  const double mean_g = LaneSum(D, [&](int64_t j) { return dy_at(j) * gamma[j]; }) / D;
  const double mean_gx = LaneSum(D, [&](int64_t j) { return dy_at(j) * gamma[j] * ((x[j] - mean) * rstd); }) / D;
  for (int64_t j = 0; j < D; ++j) {
    const double xhat = (x[j] - mean) * rstd;
    dgamma[j] += dy_at(j) * xhat;
    dbeta[j] += dy_at(j);
  }
  // dx's own loops, the residual's case apart, so each is one straight map.
  const auto v_at = [&](int64_t j) {
    const double xhat = (x[j] - mean) * rstd, g = dy_at(j) * gamma[j];
    return static_cast<T>(rstd * (g - mean_g - xhat * mean_gx));
  };
  if (res != nullptr) {
    for (int64_t j = 0; j < D; ++j) dx[j] = res[j] + v_at(j);  // add_n's sum of the two, in T
  } else {
    for (int64_t j = 0; j < D; ++j) dx[j] = v_at(j);
  }
  if constexpr (!std::is_same_v<L, T>) {
    for (int64_t j = 0; j < D; ++j) dx_low[j] = cuda::Convert<L>(dx[j]);  // the cast's rounding
  }
}

// y [R, D] = (x - mean) * rstd * gamma + beta, per row of x [R, D] (R = all
// leading dims). With out_dtype (F32 x only; passes/fold_casts) y is stored
// in BF16 / F16, each value the float one rounded as the cast kernel rounds
// it, so the op equals layer_norm then cast bit for bit.
template <typename T>
class LayerNormKernel : public StoredOutKernel<LayerNormBase> {
 public:
  using StoredOutKernel<LayerNormBase>::StoredOutKernel;

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& gamma = ctx.input(1);
    const Tensor& beta = ctx.input(2);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormParam("layer_norm", x, gamma));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormParam("layer_norm", x, beta));
    return WithStorage<T>(this->template OutDtype<T>(), "layer_norm", "out_dtype",
                          [&](auto y) { return Run<decltype(y)>(ctx, x, gamma, beta); });
  }

 private:
  template <typename Y>
  absl::Status Run(KernelContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& beta) {
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, DataTypeOf<Y>::value, x.shape()));
    const int64_t D = x.dim(x.rank() - 1), R = D == 0 ? 0 : x.num_elements() / D;
    const T* px = x.data<T>();
    const T* pg = gamma.data<T>();
    const T* pb = beta.data<T>();
    Y* py = y->data<Y>();
    const double eps = this->epsilon_;
    ParallelFor(R, MinChunk(4 * D), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) ForwardRow(D, eps, px + r * D, pg, pb, py + r * D);
    });
    return absl::OkStatus();
  }
};

// With xhat = (x - mean) * rstd and g = dy * gamma, per row (dy may be
// BF16 / F16 for an F32 x, read widened: passes/fold_casts; an optional
// residual is added to dx in T, as add_n would: passes/fuse_epilogues):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat));  dgamma = sum_rows dy * xhat;  dbeta = sum_rows dy.
// With out_dtype (F32 x; passes/fold_casts) dx is also stored as dx_low in
// BF16 / F16, each value rounded as the cast kernel rounds it: the bits of
// the cast of dx it replaces.
template <typename T>
class LayerNormGradKernel : public StoredOutKernel<LayerNormBase> {
 public:
  using StoredOutKernel<LayerNormBase>::StoredOutKernel;

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& gamma = ctx.input(1);
    const Tensor& dy = ctx.input(2);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormParam("layer_norm_grad", x, gamma));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormDy(x, dy));
    if (ctx.num_inputs() > 3) STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormResidual(x, ctx.input(3)));
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLayerNormDxLow(x, out_dtype_, ctx.num_outputs()));
    return WithStorage<T>(dy.dtype(), "layer_norm_grad", "dy",
                          [&](auto d) { return Run<decltype(d)>(ctx, x, gamma, dy); });
  }

 private:
  // dy stored as DY (T, or BF16 / F16 for an F32 x: read widened, exactly).
  template <typename DY>
  absl::Status Run(KernelContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& dy) {
    if constexpr (std::is_same_v<T, float>) {
      if (StoresAs<bfloat16>()) return RunStored<DY, bfloat16>(ctx, x, gamma, dy);
      if (StoresAs<float16>()) return RunStored<DY, float16>(ctx, x, gamma, dy);
    }
    return RunStored<DY, T>(ctx, x, gamma, dy);
  }

  // dx also stored as L in output 3 (dx_low), unless L is T (no such output).
  template <typename DY, typename L>
  absl::Status RunStored(KernelContext& ctx, const Tensor& x, const Tensor& gamma, const Tensor& dy) {
    STRATA_ASSIGN_OR_RETURN(Tensor * dx, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * dgamma, ctx.AllocateOutput(1, x.dtype(), gamma.shape()));
    STRATA_ASSIGN_OR_RETURN(Tensor * dbeta, ctx.AllocateOutput(2, x.dtype(), gamma.shape()));
    L* pdx_low = nullptr;
    if constexpr (!std::is_same_v<L, T>) {
      STRATA_ASSIGN_OR_RETURN(Tensor * dx_low, ctx.AllocateOutput(3, DataTypeOf<L>::value, x.shape()));
      pdx_low = dx_low->data<L>();
    }
    const int64_t D = x.dim(x.rank() - 1), R = D == 0 ? 0 : x.num_elements() / D;
    const int64_t rows_per_block = nn_kernels::LayerNormGradRowsPerBlock(R, D);
    const int64_t blocks = nn_kernels::LayerNormGradBlocks(R, D);
    // partial[b] holds block b's dgamma (first D) and dbeta (next D).
    STRATA_ASSIGN_OR_RETURN(Tensor partial, Scratch(ctx, F64, blocks * 2 * D));
    const T* px = x.data<T>();
    const T* pg = gamma.data<T>();
    const DY* pdy = dy.data<DY>();
    const T* pres = ctx.num_inputs() > 3 ? ctx.input(3).data<T>() : nullptr;
    T* pdx = dx->data<T>();
    double* pp = partial.data<double>();
    const double eps = epsilon_;
    ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        double* dgamma_b = pp + b * 2 * D;
        double* dbeta_b = dgamma_b + D;
        std::fill(dgamma_b, dgamma_b + 2 * D, 0.0);
        const int64_t r_end = std::min(R, (b + 1) * rows_per_block);
        for (int64_t r = b * rows_per_block; r < r_end; ++r) {
          GradRow(D, eps, px + r * D, pg, pdy + r * D, pres != nullptr ? pres + r * D : nullptr, pdx + r * D,
                  pdx_low != nullptr ? pdx_low + r * D : nullptr, dgamma_b, dbeta_b);
        }
      }
    });
    T* pdg = dgamma->data<T>();
    T* pdb = dbeta->data<T>();
    ParallelFor(D, MinChunk(2 * blocks), [&](int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        double sg = 0, sb = 0;
        for (int64_t b = 0; b < blocks; ++b) {
          sg += pp[b * 2 * D + j];
          sb += pp[b * 2 * D + D + j];
        }
        pdg[j] = static_cast<T>(sg);
        pdb[j] = static_cast<T>(sb);
      }
    });
    return absl::OkStatus();
  }
};

// layer_norm_grad's per-block partial dgamma and dbeta (doubles), for the memory plan.
absl::StatusOr<int64_t> LayerNormGradWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || def.input_types[0].shape.empty()) return int64_t{0};
  const Shape& x = def.input_types[0].shape;
  const int64_t d = x.back(), n = NumElements(x), rows = d == 0 ? 0 : n / d;
  if (rows == 0) return int64_t{0};
  return nn_kernels::LayerNormGradBlocks(rows, d) * 2 * d * static_cast<int64_t>(sizeof(double));
}
STRATA_REGISTER_WORKSPACE("layer_norm_grad", DEVICE_CPU, LayerNormGradWorkspace);

STRATA_REGISTER_KERNEL("layer_norm", DEVICE_CPU, F32, InitFactory<LayerNormKernel<float>>());
STRATA_REGISTER_KERNEL("layer_norm", DEVICE_CPU, F64, InitFactory<LayerNormKernel<double>>());
STRATA_REGISTER_KERNEL("layer_norm_grad", DEVICE_CPU, F32, InitFactory<LayerNormGradKernel<float>>());
STRATA_REGISTER_KERNEL("layer_norm_grad", DEVICE_CPU, F64, InitFactory<LayerNormGradKernel<double>>());

}  // namespace
}  // namespace strata
