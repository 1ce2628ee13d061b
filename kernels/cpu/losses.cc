// Losses and metrics: softmax_cross_entropy, mse_loss (and their backward
// ops) and accuracy. Logits are [R, C] with R all leading dims; labels I64 [R].
//
// Threads: parallel over rows (or fixed element blocks for mse); per-row or
// per-block partial sums go to scratch and are added in order, so a loss does
// not depend on the thread count.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/kernel_checks.h"
#include "kernels/shared_math.h"
#include "runtime/float16.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using kernel_checks::CheckPredAndTarget;
using nn_kernels::InitFactory;
using nn_kernels::MinChunk;
using nn_kernels::Scratch;

// Checks every label is in [0, V) so that no kernel indexes out of bounds.
absl::Status CheckLabelsBelow(const char* op, const Tensor& label, int64_t rows, int64_t V) {
  const int64_t* pl = label.data<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    if (pl[i] < 0 || pl[i] >= V) {
      return absl::InvalidArgumentError(
          absl::StrCat(op, ": label ", pl[i], " at index ", i, " is outside the classes [0, ", V, ")"));
    }
  }
  return absl::OkStatus();
}

// Rows R and classes C of logits [..., C] with labels [...]; checks every
// label is in [0, C).
absl::Status CheckLogitsAndLabels(const char* op, const Tensor& logits, const Tensor& label, int64_t* rows,
                                  int64_t* classes) {
  STRATA_RETURN_IF_ERROR(kernel_checks::CheckLogitsAndLabelShapes(op, logits, label, rows, classes));
  return CheckLabelsBelow(op, label, *rows, *classes);
}

// The base of the cross-entropy kernels: rows R, row length C and classes V
// (the `classes` attr: the first V columns, the rest padding, never read),
// the labels checked against V.
template <typename Base>
class CrossEntropyKernelBase : public Base {
 protected:
  absl::Status CheckClasses(const char* op, const Tensor& logits, const Tensor& label, int64_t* R, int64_t* C,
                            int64_t* V) const {
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckLogitsAndLabelShapes(op, logits, label, R, C));
    STRATA_ASSIGN_OR_RETURN(*V, this->Classes(op, *C));
    return CheckLabelsBelow(op, label, *R, *V);
  }
};

// The cross-entropy kernels take F32, F64, and BF16 / F16 logits (mixed
// precision: the loss reads the LM head's 16-bit output). 16-bit logits are
// widened as they are read (exact) and the math is the float kernel's, in
// double as for every dtype; the loss (and dloss) is F32, and each dlogits
// value is the float kernel's float rounded once to nearest even
// (runtime/float16.h, the cast's rounding). So the 16-bit kernels give the
// float kernel's loss and its gradient cast down, bit for bit, with no
// float32 copy of the logits or the gradient.
template <typename T>
constexpr bool kHalf = std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

// The loss's and dloss's type for logits of type T: float for 16-bit logits.
template <typename T>
using LossType = std::conditional_t<kHalf<T>, float, T>;

template <typename T>
double Wide(T x) {
  if constexpr (kHalf<T>) {
    return static_cast<double>(ToFloat(x));
  } else {
    return static_cast<double>(x);
  }
}

template <typename T>
T Narrow(double v) {
  if constexpr (std::is_same_v<T, bfloat16>) {
    return ToBfloat16(static_cast<float>(v));
  } else if constexpr (std::is_same_v<T, float16>) {
    return ToFloat16(static_cast<float>(v));
  } else {
    return static_cast<T>(v);
  }
}

// max and log(sum(exp(x - max))) of one row: log-sum-exp = max + the second.
template <typename T>
void RowLogSumExp(const T* x, int64_t c, double* max, double* log_sum) {
  double m = Wide(x[0]);
  for (int64_t j = 1; j < c; ++j) m = std::max<double>(m, Wide(x[j]));
  double s = 0;
  for (int64_t j = 0; j < c; ++j) s += std::exp(Wide(x[j]) - m);
  *max = m;
  *log_sum = std::log(s);
}

// loss [] = mean over rows of logsumexp(logits[r]) - logits[r][label[r]].
// With `classes` V < C the rows are C apart and only their first V columns
// are read.
template <typename T>
class SoftmaxCrossEntropyKernel : public CrossEntropyKernelBase<ClassesAttrKernel> {
 public:
  explicit SoftmaxCrossEntropyKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& logits = ctx.input(0);
    int64_t R, C, V;
    STRATA_RETURN_IF_ERROR(CheckClasses("softmax_cross_entropy", logits, ctx.input(1), &R, &C, &V));
    STRATA_ASSIGN_OR_RETURN(Tensor * loss, ctx.AllocateOutput(0, DataTypeOf<LossType<T>>::value, Shape{}));
    STRATA_ASSIGN_OR_RETURN(Tensor row_loss, Scratch(ctx, F64, R));
    const T* px = logits.data<T>();
    const int64_t* pl = ctx.input(1).data<int64_t>();
    double* prl = row_loss.data<double>();
    ParallelFor(R, MinChunk(3 * C), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = px + r * C;
        double max, log_sum;
        RowLogSumExp(xr, V, &max, &log_sum);
        prl[r] = max + log_sum - Wide(xr[pl[r]]);
      }
    });
    double sum = 0;
    for (int64_t r = 0; r < R; ++r) sum += prl[r];
    loss->data<LossType<T>>()[0] = static_cast<LossType<T>>(sum / static_cast<double>(R));
    return absl::OkStatus();
  }
};

// dlogits [R, C] = (softmax(logits) - onehot(label)) * dloss / R.
// With `classes` V < C the padding columns [V, C) of dlogits are zero.
// in_place: dlogits over the logits' buffer, each value read before it is
// written (the same numbers).
template <typename T>
class SoftmaxCrossEntropyGradKernel : public CrossEntropyKernelBase<CrossEntropyGradAttrsKernel> {
 public:
  explicit SoftmaxCrossEntropyGradKernel(const KernelDef&) {}

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& logits = ctx.input(0);
    const Tensor& dloss = ctx.input(2);
    int64_t R, C, V;
    STRATA_RETURN_IF_ERROR(CheckClasses("softmax_cross_entropy_grad", logits, ctx.input(1), &R, &C, &V));
    if (dloss.num_elements() != 1) {
      return absl::InvalidArgumentError(absl::StrCat("softmax_cross_entropy_grad: dloss must be a scalar, got ",
                                                     ShapeString(dloss.shape())));
    }
    if (dloss.dtype() != DataTypeOf<LossType<T>>::value) {
      return absl::InvalidArgumentError(absl::StrCat(
          "softmax_cross_entropy_grad: dloss must be ", DataTypeName(DataTypeOf<LossType<T>>::value), " for ",
          DataTypeName(logits.dtype()), " logits, got ", DataTypeName(dloss.dtype())));
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * dlogits, Dlogits(ctx, logits, this->in_place_));
    const T* px = logits.data<T>();
    const int64_t* pl = ctx.input(1).data<int64_t>();
    T* pd = dlogits->data<T>();
    const double scale = static_cast<double>(dloss.data<LossType<T>>()[0]) / static_cast<double>(R);
    ParallelFor(R, MinChunk(4 * C), [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const T* xr = px + r * C;
        T* dr = pd + r * C;
        double max, log_sum;
        RowLogSumExp(xr, V, &max, &log_sum);
        const double lse = max + log_sum;
        const int64_t l = pl[r];
        for (int64_t j = 0; j < V; ++j) {
          const double p = std::exp(Wide(xr[j]) - lse);
          dr[j] = Narrow<T>(j == l ? (p - 1.0) * scale : p * scale);
        }
        for (int64_t j = V; j < C; ++j) dr[j] = Narrow<T>(0.0);
      }
    });
    return absl::OkStatus();
  }
};

// Elements per block of the mse sum: fixed, so the order of additions is too.
constexpr int64_t kSumBlock = kFixedSumBlock;

// loss [] = mean of (pred - target)^2.
template <typename T>
class MseLossKernel : public OpKernel {
 public:
  explicit MseLossKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& pred = ctx.input(0);
    const Tensor& target = ctx.input(1);
    STRATA_RETURN_IF_ERROR(CheckPredAndTarget("mse_loss", pred, target));
    STRATA_ASSIGN_OR_RETURN(Tensor * loss, ctx.AllocateOutput(0, pred.dtype(), Shape{}));
    const int64_t n = pred.num_elements(), blocks = (n + kSumBlock - 1) / kSumBlock;
    STRATA_ASSIGN_OR_RETURN(Tensor partial, Scratch(ctx, F64, blocks));
    const T* pp = pred.data<T>();
    const T* pt = target.data<T>();
    double* ps = partial.data<double>();
    ParallelFor(blocks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t b = begin; b < end; ++b) {
        double s = 0;
        for (int64_t i = b * kSumBlock; i < std::min(n, (b + 1) * kSumBlock); ++i) {
          const double d = static_cast<double>(pp[i]) - pt[i];
          s += d * d;
        }
        ps[b] = s;
      }
    });
    double sum = 0;
    for (int64_t b = 0; b < blocks; ++b) sum += ps[b];
    loss->data<T>()[0] = static_cast<T>(sum / static_cast<double>(n));
    return absl::OkStatus();
  }
};

// dpred = 2 (pred - target) / n * dloss.
template <typename T>
class MseLossGradKernel : public OpKernel {
 public:
  explicit MseLossGradKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& pred = ctx.input(0);
    const Tensor& target = ctx.input(1);
    const Tensor& dloss = ctx.input(2);
    STRATA_RETURN_IF_ERROR(CheckPredAndTarget("mse_loss_grad", pred, target));
    STRATA_RETURN_IF_ERROR(kernel_checks::ExpectOneElement("mse_loss_grad", "dloss", dloss));
    STRATA_ASSIGN_OR_RETURN(Tensor * dpred, ctx.AllocateOutput(0, pred.dtype(), pred.shape()));
    const int64_t n = pred.num_elements();
    const T scale = MseGradScale(dloss.data<T>()[0], n);
    const T* pp = pred.data<T>();
    const T* pt = target.data<T>();
    T* pd = dpred->data<T>();
    ParallelFor(n, nn_kernels::kParallelGrain, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) pd[i] = (pp[i] - pt[i]) * scale;
    });
    return absl::OkStatus();
  }
};

// accuracy [] = fraction of rows whose label has fewer than k logits strictly above it.
template <typename T>
class AccuracyKernel : public OpKernel {
 public:
  explicit AccuracyKernel(const KernelDef&) {}
  absl::Status Init(const Op& op) {
    auto k = AttrInt(op, "k");
    if (!k.ok()) return k.status();
    k_ = *k;
    return absl::OkStatus();
  }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& logits = ctx.input(0);
    int64_t R, C;
    STRATA_RETURN_IF_ERROR(CheckLogitsAndLabels("accuracy", logits, ctx.input(1), &R, &C));
    STRATA_ASSIGN_OR_RETURN(Tensor * acc, ctx.AllocateOutput(0, logits.dtype(), Shape{}));
    const T* px = logits.data<T>();
    const int64_t* pl = ctx.input(1).data<int64_t>();
    int64_t correct = 0;
    for (int64_t r = 0; r < R; ++r) {
      const T* xr = px + r * C;
      const T target = xr[pl[r]];
      int64_t above = 0;
      for (int64_t j = 0; j < C; ++j) above += xr[j] > target;
      correct += above < k_;
    }
    acc->data<T>()[0] = static_cast<T>(static_cast<double>(correct) / static_cast<double>(R));
    return absl::OkStatus();
  }

 private:
  int64_t k_ = 1;
};

// The losses' per-row (softmax_cross_entropy) and per-block (mse_loss)
// double sums, for the memory plan.
// A double a row: every dim of the logits but the last (B, or B x T for a
// GPT's [B, T, V]; counting B alone left T - 1 of every T rows out of the
// memory plan).
absl::StatusOr<int64_t> SoftmaxCrossEntropyWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty() || def.input_types[0].shape.empty()) return int64_t{0};
  const Shape& s = def.input_types[0].shape;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < s.size(); ++d) rows *= s[d];
  return rows * static_cast<int64_t>(sizeof(double));
}
absl::StatusOr<int64_t> MseLossWorkspace(const KernelDef& def, int) {
  if (def.input_types.empty()) return int64_t{0};
  const int64_t n = NumElements(def.input_types[0].shape);
  return (n + kSumBlock - 1) / kSumBlock * static_cast<int64_t>(sizeof(double));
}
STRATA_REGISTER_WORKSPACE("softmax_cross_entropy", DEVICE_CPU, SoftmaxCrossEntropyWorkspace);
STRATA_REGISTER_WORKSPACE("mse_loss", DEVICE_CPU, MseLossWorkspace);

STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CPU, F32, InitFactory<SoftmaxCrossEntropyKernel<float>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CPU, F64, InitFactory<SoftmaxCrossEntropyKernel<double>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CPU, F32,
                       InitFactory<SoftmaxCrossEntropyGradKernel<float>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CPU, F64,
                       InitFactory<SoftmaxCrossEntropyGradKernel<double>>());
// BF16 / F16 logits (mixed precision): read as they are, no float32 copies.
STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CPU, BF16, InitFactory<SoftmaxCrossEntropyKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy", DEVICE_CPU, F16, InitFactory<SoftmaxCrossEntropyKernel<float16>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CPU, BF16,
                       InitFactory<SoftmaxCrossEntropyGradKernel<bfloat16>>());
STRATA_REGISTER_KERNEL("softmax_cross_entropy_grad", DEVICE_CPU, F16,
                       InitFactory<SoftmaxCrossEntropyGradKernel<float16>>());
STRATA_REGISTER_KERNEL("mse_loss", DEVICE_CPU, F32, InitFactory<MseLossKernel<float>>());
STRATA_REGISTER_KERNEL("mse_loss", DEVICE_CPU, F64, InitFactory<MseLossKernel<double>>());
STRATA_REGISTER_KERNEL("mse_loss_grad", DEVICE_CPU, F32, InitFactory<MseLossGradKernel<float>>());
STRATA_REGISTER_KERNEL("mse_loss_grad", DEVICE_CPU, F64, InitFactory<MseLossGradKernel<double>>());
STRATA_REGISTER_KERNEL("accuracy", DEVICE_CPU, F32, InitFactory<AccuracyKernel<float>>());
STRATA_REGISTER_KERNEL("accuracy", DEVICE_CPU, F64, InitFactory<AccuracyKernel<double>>());

}  // namespace
}  // namespace strata
