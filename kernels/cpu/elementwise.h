#ifndef STRATA_KERNELS_CPU_ELEMENTWISE_H_
#define STRATA_KERNELS_CPU_ELEMENTWISE_H_

// Shared helpers for elementwise, broadcasting and reduction kernels.
// Threads: every helper splits its output into contiguous chunks of at least
// kElementwiseMinChunk elements, so tensors smaller than that run inline.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "kernels/broadcast_plan.h"
#include "kernels/kernel_checks.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"
#include "runtime/thread_pool.h"

namespace strata {

// Elements below which a loop is not worth handing to other threads.
inline constexpr int64_t kElementwiseMinChunk = 32768;

// Accumulator type for sums: double for floating types (deterministic and
// accurate for F32), int64 for integers.
template <typename T>
using AccumulatorOf = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

namespace internal {

// Elements per block of the maps below: a constant trip count that gcc's
// -O2 ("very cheap") vectorizer turns into straight SIMD code.
inline constexpr int64_t kMapBlock = 16;

// Whether [a, a + n) and [b, b + m) share a byte.
template <typename A, typename B>
inline bool Overlap(const A* a, int64_t n, const B* b, int64_t m) {
  const auto a0 = reinterpret_cast<uintptr_t>(a), b0 = reinterpret_cast<uintptr_t>(b);
  return a0 < b0 + static_cast<uintptr_t>(m) * sizeof(B) && b0 < a0 + static_cast<uintptr_t>(n) * sizeof(A);
}

// STRATA_ISA_CLONES: with GCC on x86-64, the function is compiled three
// times, for x86-64-v4 (AVX-512), x86-64-v3 (AVX2) and the baseline
// (SSE2), and the loader picks the best one the CPU runs (an ifunc), so the
// maps below vectorize 16 floats wide where the CPU can (gelu's tanh: 0.3
// against 1.7 ns an element on the baseline's 4, on this VM). The binary
// stays portable, and the clones compute the baseline's bits (up to the
// sign and payload of a NaN made from two NaNs): their functors are plain
// IEEE arithmetic, and -ffp-contract=off (.bazelrc, and kernels/cpu's
// copts) keeps a * b + c from becoming an FMA on the clones that have one
// (ElementwiseTest.IsaClonesRoundAsTheBaseline). The cloned functions are
// `static`: an ifunc of a template (COMDAT) defined in an executable and
// called from a shared library of the test build fails at load ("creates
// an unsatisfiable circular dependency"), inline or hidden alike.
// ThreadSanitizer builds get the plain function: GCC instruments the
// resolver, which the loader runs before TSan is up (a crash before main).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
#define STRATA_ISA_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define STRATA_ISA_CLONES
#endif

// The clone the loader picks on this CPU, in words (for tests' and tools' logs).
inline const char* IsaCloneName() {
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4 (AVX-512)";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3 (AVX2)";
#endif
  return "baseline";
}

// y[i] = f(x[i]) over non-overlapping ranges (__restrict: no alias checks,
// so the blocked loop vectorizes).
template <typename T, typename U, typename F>
static STRATA_ISA_CLONES void UnaryLoop(int64_t n, const T* __restrict x, U* __restrict y, F f) {
  int64_t i = 0;
  for (; i + kMapBlock <= n; i += kMapBlock) {
    for (int64_t k = 0; k < kMapBlock; ++k) y[i + k] = f(x[i + k]);
  }
  for (; i < n; ++i) y[i] = f(x[i]);
}

// z[i] = f(x[i], y[i]) over ranges z does not overlap.
template <typename T, typename V, typename U, typename F>
static STRATA_ISA_CLONES void BinaryLoop(int64_t n, const T* __restrict x, const V* __restrict y, U* __restrict z, F f) {
  int64_t i = 0;
  for (; i + kMapBlock <= n; i += kMapBlock) {
    for (int64_t k = 0; k < kMapBlock; ++k) z[i + k] = f(x[i + k], y[i + k]);
  }
  for (; i < n; ++i) z[i] = f(x[i], y[i]);
}

}  // namespace internal

// y[i] = f(x[i]) for i in [0, n).
template <typename T, typename U, typename F>
void UnaryMap(int64_t n, const T* x, U* y, F f) {
  const bool overlap = internal::Overlap(x, n, y, n);
  ParallelFor(n, kElementwiseMinChunk, [&](int64_t begin, int64_t end) {
    if (overlap) {
      for (int64_t i = begin; i < end; ++i) y[i] = f(x[i]);
    } else {
      internal::UnaryLoop(end - begin, x + begin, y + begin, f);
    }
  });
}

// z[i] = f(x[i], y[i]) for i in [0, n): same-shape binary map (x and y may
// be stored in different types). z may be x or y (in-place accumulation);
// that case takes the plain loop.
template <typename T, typename V, typename U, typename F>
void BinaryMap(int64_t n, const T* x, const V* y, U* z, F f) {
  const bool overlap = internal::Overlap(x, n, z, n) || internal::Overlap(y, n, z, n);
  ParallelFor(n, kElementwiseMinChunk, [&](int64_t begin, int64_t end) {
    if (overlap) {
      for (int64_t i = begin; i < end; ++i) z[i] = f(x[i], y[i]);
    } else {
      internal::BinaryLoop(end - begin, x + begin, y + begin, z + begin, f);
    }
  });
}

// y = F()(x) over a tensor of T.
template <typename T, typename F>
class UnaryKernel : public OpKernel {
 public:
  explicit UnaryKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, DataTypeOf<T>::value, x.shape());
    if (!y.ok()) return y.status();
    UnaryMap(x.num_elements(), x.data<T>(), (*y)->data<T>(), F());
    return absl::OkStatus();
  }
};

// dx = F()(a, dy) for backward helpers whose two inputs have one shape.
template <typename T, typename F>
class SameShapeBinaryKernel : public OpKernel {
 public:
  explicit SameShapeBinaryKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& a = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    if (absl::Status s = kernel_checks::CheckSameShapes(a, dy); !s.ok()) return s;
    absl::StatusOr<Tensor*> dx = ctx.AllocateOutput(0, DataTypeOf<T>::value, a.shape());
    if (!dx.ok()) return dx.status();
    BinaryMap(a.num_elements(), a.data<T>(), dy.data<T>(), (*dx)->data<T>(), F());
    return absl::OkStatus();
  }
};

namespace internal {
// z[i] = f(a, y[i]) or, with kScalarFirst false, f(y[i], a), over ranges z
// does not overlap.
template <bool kScalarFirst, typename T, typename U, typename F>
inline void ScalarLoop(int64_t n, const T a, const T* __restrict y, U* __restrict z, F f) {
  int64_t i = 0;
  for (; i + kMapBlock <= n; i += kMapBlock) {
    for (int64_t k = 0; k < kMapBlock; ++k) z[i + k] = kScalarFirst ? f(a, y[i + k]) : f(y[i + k], a);
  }
  for (; i < n; ++i) z[i] = kScalarFirst ? f(a, y[i]) : f(y[i], a);
}

template <typename T, typename U, typename F>
inline void InnerLoop(int64_t n, const T* x, int64_t sx, const T* y, int64_t sy, U* z, F f) {
  // Separate loops per stride pattern so each vectorizes; an output that
  // overlaps an input takes the plain loops.
  const bool overlap = Overlap(x, sx == 1 ? n : 1, z, n) || Overlap(y, sy == 1 ? n : 1, z, n);
  if (sx == 1 && sy == 1) {
    if (!overlap) return BinaryLoop(n, x, y, z, f);
    for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], y[i]);
  } else if (sx == 1) {
    const T b = y[0];
    if (!overlap) return ScalarLoop<false>(n, b, x, z, f);
    for (int64_t i = 0; i < n; ++i) z[i] = f(x[i], b);
  } else if (sy == 1) {
    const T a = x[0];
    if (!overlap) return ScalarLoop<true>(n, a, y, z, f);
    for (int64_t i = 0; i < n; ++i) z[i] = f(a, y[i]);
  } else {
    const U c = f(x[0], y[0]);
    for (int64_t i = 0; i < n; ++i) z[i] = c;
  }
}
}  // namespace internal

// z = f(x, y) over plan.out_shape. Threads split the outer rows (or, with a
// single row, the inner range) into contiguous chunks.
template <typename T, typename U, typename F>
void BroadcastBinary(const BroadcastPlan& plan, const T* x, const T* y, U* z, F f) {
  const int64_t inner = plan.inner, sx = plan.inner_x_stride, sy = plan.inner_y_stride;
  if (plan.outer_count == 0 || inner == 0) return;
  if (plan.outer_count == 1) {
    ParallelFor(inner, kElementwiseMinChunk, [&](int64_t begin, int64_t end) {
      internal::InnerLoop(end - begin, x + begin * sx, sx, y + begin * sy, sy, z + begin, f);
    });
    return;
  }
  const int rank = static_cast<int>(plan.outer_dims.size());
  const int64_t min_rows = std::max<int64_t>(1, kElementwiseMinChunk / inner);
  ParallelFor(plan.outer_count, min_rows, [&](int64_t begin, int64_t end) {
    // Odometer position of row `begin`, then walk row by row.
    absl::InlinedVector<int64_t, 6> index(rank, 0);
    int64_t ox = 0, oy = 0;
    int64_t rest = begin;
    for (int d = rank - 1; d >= 0; --d) {
      index[d] = rest % plan.outer_dims[d];
      rest /= plan.outer_dims[d];
      ox += index[d] * plan.outer_x_strides[d];
      oy += index[d] * plan.outer_y_strides[d];
    }
    for (int64_t row = begin; row < end; ++row) {
      internal::InnerLoop(inner, x + ox, sx, y + oy, sy, z + row * inner, f);
      for (int d = rank - 1; d >= 0; --d) {
        ++index[d];
        ox += plan.outer_x_strides[d];
        oy += plan.outer_y_strides[d];
        if (index[d] < plan.outer_dims[d]) break;
        ox -= index[d] * plan.outer_x_strides[d];
        oy -= index[d] * plan.outer_y_strides[d];
        index[d] = 0;
      }
    }
  });
}

// A reduction seen as in[M, K, N] -> out[M, N], summing over K.
struct ReduceDims {
  int64_t m = 1, k = 1, n = 1;
};

// out[m, n] = scale * sum_k in[m, k, n]. Sums accumulate in Acc; partial sums
// over fixed blocks of K are combined in order, so the result does not depend
// on the thread count. Threads split (m, column block) pairs, or K blocks when
// those are few.
template <typename In, typename Out, typename Acc>
void ReduceMiddle(const In* in, ReduceDims d, Out* out, Acc scale);

// Sums `in` (shape `shape`) over the dims flagged in `reduced` into `out`
// (the kept dims in order), multiplied by `scale`. Reductions over
// non-adjacent groups of dims run as several ReduceMiddle passes.
template <typename T>
void ReduceSum(const T* in, absl::Span<const int64_t> shape, const std::vector<bool>& reduced, T* out,
               AccumulatorOf<T> scale);

// ---------------------------------------------------------------------------
// Implementation of the templates above.

template <typename In, typename Out, typename Acc>
void ReduceMiddle(const In* in, ReduceDims d, Out* out, Acc scale) {
  const int64_t M = d.m, K = d.k, N = d.n;
  if (M == 0 || N == 0) return;
  if (K == 0) {
    for (int64_t i = 0; i < M * N; ++i) out[i] = static_cast<Out>(Acc(0) * scale);
    return;
  }
  // Column blocks keep a stack accumulator that the compiler vectorizes.
  constexpr int64_t kBlock = 256;
  const int64_t n_blocks = (N + kBlock - 1) / kBlock;
  // Rows of K summed by one task: about kElementwiseMinChunk elements.
  const int64_t k_chunk = std::max<int64_t>(1, kElementwiseMinChunk / std::min(N, kBlock));
  const int64_t k_chunks = (K + k_chunk - 1) / k_chunk;

  // Sums rows [k0, k1) of (m, block) into acc[0, width).
  auto sum_block = [&](int64_t m, int64_t block, int64_t k0, int64_t k1, Acc* acc) -> int64_t {
    const int64_t n0 = block * kBlock, width = std::min(kBlock, N - n0);
    for (int64_t j = 0; j < width; ++j) acc[j] = Acc(0);
    if (N == 1) {
      // Four independent sums hide the add latency; the order stays fixed.
      const In* p = in + m * K;
      Acc s0 = Acc(0), s1 = Acc(0), s2 = Acc(0), s3 = Acc(0);
      int64_t k = k0;
      for (; k + 4 <= k1; k += 4) {
        s0 += static_cast<Acc>(p[k]);
        s1 += static_cast<Acc>(p[k + 1]);
        s2 += static_cast<Acc>(p[k + 2]);
        s3 += static_cast<Acc>(p[k + 3]);
      }
      for (; k < k1; ++k) s0 += static_cast<Acc>(p[k]);
      acc[0] = (s0 + s1) + (s2 + s3);
      return 1;
    }
    for (int64_t k = k0; k < k1; ++k) {
      const In* row = in + (m * K + k) * N + n0;
      for (int64_t j = 0; j < width; ++j) acc[j] += static_cast<Acc>(row[j]);
    }
    return width;
  };

  // The choice depends on shapes only (never the thread count), so a
  // reduction rounds the same way on every machine.
  constexpr int64_t kEnoughTasks = 16;
  const int64_t tasks = M * n_blocks;
  if (k_chunks == 1 || tasks >= kEnoughTasks) {
    // Enough independent outputs: each task sums all of K for its block.
    const int64_t min_tasks = std::max<int64_t>(1, kElementwiseMinChunk / std::max<int64_t>(1, K * std::min(N, kBlock)));
    ParallelFor(tasks, min_tasks, [&](int64_t begin, int64_t end) {
      Acc acc[kBlock];
      for (int64_t t = begin; t < end; ++t) {
        const int64_t m = t / n_blocks, block = t % n_blocks;
        const int64_t width = sum_block(m, block, 0, K, acc);
        Out* o = out + m * N + block * kBlock;
        for (int64_t j = 0; j < width; ++j) o[j] = static_cast<Out>(acc[j] * scale);
      }
    });
    return;
  }
  // Few outputs over a long K: partial sums per fixed K chunk, then combined
  // in chunk order.
  std::vector<Acc> partial(static_cast<size_t>(k_chunks * M * N));
  ParallelFor(k_chunks * tasks, 1, [&](int64_t begin, int64_t end) {
    Acc acc[kBlock];
    for (int64_t t = begin; t < end; ++t) {
      const int64_t c = t / tasks, rest = t % tasks;
      const int64_t m = rest / n_blocks, block = rest % n_blocks;
      const int64_t k0 = c * k_chunk, k1 = std::min(K, k0 + k_chunk);
      const int64_t width = sum_block(m, block, k0, k1, acc);
      Acc* p = partial.data() + (c * M + m) * N + block * kBlock;
      for (int64_t j = 0; j < width; ++j) p[j] = acc[j];
    }
  });
  ParallelFor(M * N, kElementwiseMinChunk / std::max<int64_t>(1, k_chunks), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      Acc s = Acc(0);
      for (int64_t c = 0; c < k_chunks; ++c) s += partial[c * M * N + i];
      out[i] = static_cast<Out>(s * scale);
    }
  });
}

template <typename T>
void ReduceSum(const T* in, absl::Span<const int64_t> shape, const std::vector<bool>& reduced, T* out,
               AccumulatorOf<T> scale) {
  using Acc = AccumulatorOf<T>;
  // Merge adjacent dims of the same kind; size-1 dims do not matter.
  std::vector<int64_t> dims;
  std::vector<bool> kinds;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!dims.empty() && kinds.back() == reduced[i]) {
      dims.back() *= shape[i];
    } else {
      dims.push_back(shape[i]);
      kinds.push_back(reduced[i]);
    }
  }
  int groups = 0;
  for (bool k : kinds) groups += k ? 1 : 0;
  if (groups <= 1) {
    // One pass: [kept..., reduced, kept...].
    ReduceDims d;
    bool seen = false;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (kinds[i]) {
        d.k = dims[i];
        seen = true;
      } else if (seen) {
        d.n *= dims[i];
      } else {
        d.m *= dims[i];
      }
    }
    ReduceMiddle<T, T, Acc>(in, d, out, scale);
    return;
  }
  // Several groups: reduce the innermost group first into an Acc buffer, and
  // repeat until one group is left.
  std::vector<Acc> current;
  bool from_input = true;
  while (true) {
    int last = -1, count = 0;
    for (int i = 0; i < static_cast<int>(dims.size()); ++i) {
      if (kinds[i]) {
        last = i;
        ++count;
      }
    }
    ReduceDims d;
    for (int i = 0; i < last; ++i) d.m *= dims[i];
    d.k = dims[last];
    for (int i = last + 1; i < static_cast<int>(dims.size()); ++i) d.n *= dims[i];
    if (count == 1) {
      // from_input is false here: there were at least two groups.
      ReduceMiddle<Acc, T, Acc>(current.data(), d, out, scale);
      return;
    }
    std::vector<Acc> next(static_cast<size_t>(d.m * d.n));
    if (from_input) {
      ReduceMiddle<T, Acc, Acc>(in, d, next.data(), Acc(1));
      from_input = false;
    } else {
      ReduceMiddle<Acc, Acc, Acc>(current.data(), d, next.data(), Acc(1));
    }
    current.swap(next);
    // Drop the reduced group and merge the kept dims around it.
    // (Groups alternate, so dims[last - 1] is a kept dim.)
    if (last + 1 < static_cast<int>(dims.size())) {
      dims[last - 1] *= dims[last + 1];
      dims.erase(dims.begin() + last, dims.begin() + last + 2);
      kinds.erase(kinds.begin() + last, kinds.begin() + last + 2);
    } else {
      dims.erase(dims.begin() + last);
      kinds.erase(kinds.begin() + last);
    }
  }
}

}  // namespace strata

#endif  // STRATA_KERNELS_CPU_ELEMENTWISE_H_
