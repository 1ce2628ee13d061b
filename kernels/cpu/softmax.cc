// softmax, log_softmax and their backward helpers along one `axis`.
// x is viewed as [M, K, N] with K the softmax axis; each of the M * N lanes
// (K elements, stride N) is independent. Threads split the rows (N == 1) or
// blocks of kBlockWidth adjacent lanes into chunks of about
// kElementwiseMinChunk elements.

#include <cmath>
#include <limits>

#include "kernels/cpu/elementwise.h"
#include "kernels/kernel_checks.h"
#include "proto/shape_rules.h"

namespace strata {
namespace {

enum class Mode { kSoftmax, kLogSoftmax, kSoftmaxGrad, kLogSoftmaxGrad };

// One contiguous lane (softmax over the last axis): out = f(a[0..K)), and b
// for the grads.
template <typename T, Mode kMode>
void Lane(const T* a, const T* b, T* out, int64_t K) {
  using Acc = AccumulatorOf<T>;
  if constexpr (kMode == Mode::kSoftmax || kMode == Mode::kLogSoftmax) {
    // Subtract the max so exp never overflows.
    T max = -std::numeric_limits<T>::infinity();
    for (int64_t k = 0; k < K; ++k) max = std::max(max, a[k]);
    Acc sum = 0;
    if constexpr (kMode == Mode::kSoftmax) {
      for (int64_t k = 0; k < K; ++k) {
        const T e = std::exp(a[k] - max);
        out[k] = e;
        sum += e;
      }
      const T inv = static_cast<T>(Acc(1) / sum);
      for (int64_t k = 0; k < K; ++k) out[k] *= inv;
    } else {
      for (int64_t k = 0; k < K; ++k) sum += std::exp(a[k] - max);
      // (a - max) first: folding log(sum) into max would round it at max's scale.
      const T log_sum = static_cast<T>(std::log(sum));
      for (int64_t k = 0; k < K; ++k) out[k] = (a[k] - max) - log_sum;
    }
  } else if constexpr (kMode == Mode::kSoftmaxGrad) {
    // a = y, b = dy: dx = y * (dy - sum(dy * y)).
    Acc dot = 0;
    for (int64_t k = 0; k < K; ++k) dot += static_cast<Acc>(a[k]) * b[k];
    const T d = static_cast<T>(dot);
    for (int64_t k = 0; k < K; ++k) out[k] = a[k] * (b[k] - d);
  } else {
    // a = y (log-probabilities), b = dy: dx = dy - exp(y) * sum(dy).
    Acc total = 0;
    for (int64_t k = 0; k < K; ++k) total += b[k];
    const T t = static_cast<T>(total);
    for (int64_t k = 0; k < K; ++k) out[k] = b[k] - std::exp(a[k]) * t;
  }
}

// kBlockWidth adjacent lanes of one m (axis not last): walks the K rows in
// memory order, keeping one running value per lane.
constexpr int64_t kBlockWidth = 64;

template <typename T, Mode kMode>
void LaneBlock(const T* a, const T* b, T* out, int64_t K, int64_t N, int64_t width) {
  using Acc = AccumulatorOf<T>;
  Acc acc[kBlockWidth];
  for (int64_t j = 0; j < width; ++j) acc[j] = Acc(0);
  if constexpr (kMode == Mode::kSoftmax || kMode == Mode::kLogSoftmax) {
    T max[kBlockWidth];
    for (int64_t j = 0; j < width; ++j) max[j] = -std::numeric_limits<T>::infinity();
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < width; ++j) max[j] = std::max(max[j], a[k * N + j]);
    }
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < width; ++j) {
        const T e = std::exp(a[k * N + j] - max[j]);
        if constexpr (kMode == Mode::kSoftmax) out[k * N + j] = e;
        acc[j] += e;
      }
    }
    T tail[kBlockWidth];
    for (int64_t j = 0; j < width; ++j) {
      tail[j] = static_cast<T>(kMode == Mode::kSoftmax ? Acc(1) / acc[j] : std::log(acc[j]));
    }
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < width; ++j) {
        if constexpr (kMode == Mode::kSoftmax) {
          out[k * N + j] *= tail[j];
        } else {
          out[k * N + j] = (a[k * N + j] - max[j]) - tail[j];
        }
      }
    }
  } else {
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < width; ++j) {
        if constexpr (kMode == Mode::kSoftmaxGrad) {
          acc[j] += static_cast<Acc>(a[k * N + j]) * b[k * N + j];
        } else {
          acc[j] += b[k * N + j];
        }
      }
    }
    T sum[kBlockWidth];
    for (int64_t j = 0; j < width; ++j) sum[j] = static_cast<T>(acc[j]);
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t j = 0; j < width; ++j) {
        const int64_t i = k * N + j;
        if constexpr (kMode == Mode::kSoftmaxGrad) {
          out[i] = a[i] * (b[i] - sum[j]);
        } else {
          out[i] = b[i] - std::exp(a[i]) * sum[j];
        }
      }
    }
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
    absl::StatusOr<int> axis = NormalizeInputAxis(axis_, rank, kGrad ? "y" : "x");
    if (!axis.ok()) return axis.status();
    const T* b = nullptr;
    if constexpr (kGrad) {
      if (absl::Status s = kernel_checks::CheckSameShapeAsY(a, ctx.input(1)); !s.ok()) return s;
      b = ctx.input(1).data<T>();
    }
    absl::StatusOr<Tensor*> out = ctx.AllocateOutput(0, DataTypeOf<T>::value, a.shape());
    if (!out.ok()) return out.status();
    int64_t M = 1, N = 1;
    const int64_t K = a.dim(*axis);
    for (int d = 0; d < *axis; ++d) M *= a.dim(d);
    for (int d = *axis + 1; d < rank; ++d) N *= a.dim(d);
    if (M * N * K == 0) return absl::OkStatus();
    const T* x = a.data<T>();
    T* y = (*out)->data<T>();
    if (N == 1) {
      ParallelFor(M, std::max<int64_t>(1, kElementwiseMinChunk / K), [&](int64_t begin, int64_t end) {
        for (int64_t m = begin; m < end; ++m) {
          Lane<T, kMode>(x + m * K, b ? b + m * K : nullptr, y + m * K, K);
        }
      });
      return absl::OkStatus();
    }
    const int64_t blocks = (N + kBlockWidth - 1) / kBlockWidth;
    const int64_t min_tasks = std::max<int64_t>(1, kElementwiseMinChunk / (K * std::min(N, kBlockWidth)));
    ParallelFor(M * blocks, min_tasks, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t m = t / blocks, n0 = (t % blocks) * kBlockWidth;
        const int64_t offset = m * K * N + n0;
        LaneBlock<T, kMode>(x + offset, b ? b + offset : nullptr, y + offset, K, N, std::min(kBlockWidth, N - n0));
      }
    });
    return absl::OkStatus();
  }

 private:
  explicit SoftmaxKernel(int64_t axis) : axis_(axis) {}
  int64_t axis_;
};

STRATA_REGISTER_KERNEL("softmax", DEVICE_CPU, F32, (SoftmaxKernel<float, Mode::kSoftmax>::Create));
STRATA_REGISTER_KERNEL("softmax", DEVICE_CPU, F64, (SoftmaxKernel<double, Mode::kSoftmax>::Create));
STRATA_REGISTER_KERNEL("log_softmax", DEVICE_CPU, F32, (SoftmaxKernel<float, Mode::kLogSoftmax>::Create));
STRATA_REGISTER_KERNEL("log_softmax", DEVICE_CPU, F64, (SoftmaxKernel<double, Mode::kLogSoftmax>::Create));
STRATA_REGISTER_KERNEL("softmax_grad", DEVICE_CPU, F32, (SoftmaxKernel<float, Mode::kSoftmaxGrad>::Create));
STRATA_REGISTER_KERNEL("softmax_grad", DEVICE_CPU, F64, (SoftmaxKernel<double, Mode::kSoftmaxGrad>::Create));
STRATA_REGISTER_KERNEL("log_softmax_grad", DEVICE_CPU, F32, (SoftmaxKernel<float, Mode::kLogSoftmaxGrad>::Create));
STRATA_REGISTER_KERNEL("log_softmax_grad", DEVICE_CPU, F64, (SoftmaxKernel<double, Mode::kLogSoftmaxGrad>::Create));

}  // namespace
}  // namespace strata
