// softmax, log_softmax and their backward helpers along one `axis`.
// x is viewed as [M, K, N] with K the softmax axis; each of the M * N lanes
// (K elements, stride N) is independent. Threads split the lanes into
// contiguous chunks of about kElementwiseMinChunk elements.

#include <cmath>
#include <limits>

#include "kernels/cpu/elementwise.h"

namespace strata {
namespace {

enum class Mode { kSoftmax, kLogSoftmax, kSoftmaxGrad, kLogSoftmaxGrad };

// One lane: out = f(a[0..K)) (and b for the grads), elements `stride` apart.
template <typename T, Mode kMode, bool kContiguous>
void Lane(const T* a, const T* b, T* out, int64_t K, int64_t n) {
  using Acc = AccumulatorOf<T>;
  const int64_t s = kContiguous ? 1 : n;
  if constexpr (kMode == Mode::kSoftmax || kMode == Mode::kLogSoftmax) {
    // Subtract the max so exp never overflows.
    T max = -std::numeric_limits<T>::infinity();
    for (int64_t k = 0; k < K; ++k) max = std::max(max, a[k * s]);
    Acc sum = 0;
    if constexpr (kMode == Mode::kSoftmax) {
      for (int64_t k = 0; k < K; ++k) {
        const T e = std::exp(a[k * s] - max);
        out[k * s] = e;
        sum += e;
      }
      const T inv = static_cast<T>(Acc(1) / sum);
      for (int64_t k = 0; k < K; ++k) out[k * s] *= inv;
    } else {
      for (int64_t k = 0; k < K; ++k) sum += std::exp(a[k * s] - max);
      // (a - max) first: folding log(sum) into max would round it at max's scale.
      const T log_sum = static_cast<T>(std::log(sum));
      for (int64_t k = 0; k < K; ++k) out[k * s] = (a[k * s] - max) - log_sum;
    }
  } else if constexpr (kMode == Mode::kSoftmaxGrad) {
    // a = y, b = dy: dx = y * (dy - sum(dy * y)).
    Acc dot = 0;
    for (int64_t k = 0; k < K; ++k) dot += static_cast<Acc>(a[k * s]) * b[k * s];
    const T d = static_cast<T>(dot);
    for (int64_t k = 0; k < K; ++k) out[k * s] = a[k * s] * (b[k * s] - d);
  } else {
    // a = y (log-probabilities), b = dy: dx = dy - exp(y) * sum(dy).
    Acc total = 0;
    for (int64_t k = 0; k < K; ++k) total += b[k * s];
    const T t = static_cast<T>(total);
    for (int64_t k = 0; k < K; ++k) out[k * s] = b[k * s] - std::exp(a[k * s]) * t;
  }
}

template <typename T, Mode kMode>
class SoftmaxKernel : public OpKernel {
 public:
  static constexpr bool kGrad = kMode == Mode::kSoftmaxGrad || kMode == Mode::kLogSoftmaxGrad;

  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const KernelDef& def) {
    absl::StatusOr<int64_t> axis = AttrInt(*def.op, "axis");
    if (!axis.ok()) return axis.status();
    return std::unique_ptr<OpKernel>(new SoftmaxKernel(*axis));
  }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const int rank = a.rank();
    if (rank == 0 || axis_ < -rank || axis_ >= rank) {
      return absl::InvalidArgumentError(
          absl::StrCat("axis ", axis_, " is out of range for input shape ", ShapeString(a.shape())));
    }
    const T* b = nullptr;
    if constexpr (kGrad) {
      if (ctx.input(1).shape() != a.shape()) {
        return absl::InvalidArgumentError(absl::StrCat("y ", ShapeString(a.shape()), " and dy ",
                                                       ShapeString(ctx.input(1).shape()), " must match"));
      }
      b = ctx.input(1).data<T>();
    }
    absl::StatusOr<Tensor*> out = ctx.AllocateOutput(0, DataTypeOf<T>::value, a.shape());
    if (!out.ok()) return out.status();
    const int axis = static_cast<int>(axis_ < 0 ? axis_ + rank : axis_);
    int64_t M = 1, N = 1;
    const int64_t K = a.dim(axis);
    for (int d = 0; d < axis; ++d) M *= a.dim(d);
    for (int d = axis + 1; d < rank; ++d) N *= a.dim(d);
    if (M * N * K == 0) return absl::OkStatus();
    const T* x = a.data<T>();
    T* y = (*out)->data<T>();
    ParallelFor(M * N, std::max<int64_t>(1, kElementwiseMinChunk / K), [&](int64_t begin, int64_t end) {
      for (int64_t lane = begin; lane < end; ++lane) {
        const int64_t offset = (lane / N) * K * N + lane % N;
        if (N == 1) {
          Lane<T, kMode, true>(x + offset, b ? b + offset : nullptr, y + offset, K, N);
        } else {
          Lane<T, kMode, false>(x + offset, b ? b + offset : nullptr, y + offset, K, N);
        }
      }
    });
    return absl::OkStatus();
  }

 private:
  explicit SoftmaxKernel(int64_t axis) : axis_(axis) {}
  int64_t axis_;
};

STRATA_REGISTER_KERNEL("softmax", "cpu", F32, (SoftmaxKernel<float, Mode::kSoftmax>::Create));
STRATA_REGISTER_KERNEL("softmax", "cpu", F64, (SoftmaxKernel<double, Mode::kSoftmax>::Create));
STRATA_REGISTER_KERNEL("log_softmax", "cpu", F32, (SoftmaxKernel<float, Mode::kLogSoftmax>::Create));
STRATA_REGISTER_KERNEL("log_softmax", "cpu", F64, (SoftmaxKernel<double, Mode::kLogSoftmax>::Create));
STRATA_REGISTER_KERNEL("softmax_grad", "cpu", F32, (SoftmaxKernel<float, Mode::kSoftmaxGrad>::Create));
STRATA_REGISTER_KERNEL("softmax_grad", "cpu", F64, (SoftmaxKernel<double, Mode::kSoftmaxGrad>::Create));
STRATA_REGISTER_KERNEL("log_softmax_grad", "cpu", F32, (SoftmaxKernel<float, Mode::kLogSoftmaxGrad>::Create));
STRATA_REGISTER_KERNEL("log_softmax_grad", "cpu", F64, (SoftmaxKernel<double, Mode::kLogSoftmaxGrad>::Create));

}  // namespace
}  // namespace strata
