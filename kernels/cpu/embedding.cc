// embedding (row gather) and embedding_grad (dense scatter-add into [V, D]).
//
// Threads: the gather runs in parallel over ids. The scatter-add runs in
// parallel over slices of the D columns: each thread walks every id but
// writes only its own columns, so no two threads touch the same element and
// the sums are added in id order whatever the thread count.

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "kernels/kernel_checks.h"
#include "runtime/kernel.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using nn_kernels::InitFactory;
using nn_kernels::MinChunk;

absl::Status CheckIds(const char* op, const Tensor& ids, int64_t vocab) {
  STRATA_RETURN_IF_ERROR(kernel_checks::CheckIdsDtype(op, ids));
  const int64_t* p = ids.data<int64_t>();
  for (int64_t i = 0; i < ids.num_elements(); ++i) {
    if (p[i] < 0 || p[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": id ", p[i], " at index ", i,
                                                     " is outside the table's rows [0, ", vocab, ")"));
    }
  }
  return absl::OkStatus();
}

// y [..., D] = table [V, D] rows at ids [...].
template <typename T>
class EmbeddingKernel : public OpKernel {
 public:
  explicit EmbeddingKernel(const KernelDef&) {}
  absl::Status Init(const Op&) { return absl::OkStatus(); }

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& ids = ctx.input(0);
    const Tensor& table = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckEmbeddingTable(table));
    const int64_t V = table.dim(0), D = table.dim(1);
    STRATA_RETURN_IF_ERROR(CheckIds("embedding", ids, V));
    Shape ys = ids.shape();
    ys.push_back(D);
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, table.dtype(), ys));
    const int64_t* pid = ids.data<int64_t>();
    const T* pt = table.data<T>();
    T* py = y->data<T>();
    ParallelFor(ids.num_elements(), MinChunk(D), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) std::memcpy(py + i * D, pt + pid[i] * D, D * sizeof(T));
    });
    return absl::OkStatus();
  }
};

// dtable [V, D] = zeros, then dtable[ids[i]] += dy[i] for every position i.
template <typename T>
class EmbeddingGradKernel : public EmbeddingGradAttrsKernel {
 public:
  using EmbeddingGradAttrsKernel::EmbeddingGradAttrsKernel;

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& ids = ctx.input(0);
    const Tensor& dy = ctx.input(1);
    STRATA_RETURN_IF_ERROR(kernel_checks::CheckEmbeddingGradShapes(ids, dy));
    STRATA_RETURN_IF_ERROR(CheckIds("embedding_grad", ids, vocab_));
    const int64_t D = dy.dim(dy.rank() - 1), n = ids.num_elements();
    STRATA_ASSIGN_OR_RETURN(Tensor * dtable, ctx.AllocateOutput(0, dy.dtype(), Shape{vocab_, D}));
    std::memset(dtable->raw_data(), 0, dtable->bytes());
    const int64_t* pid = ids.data<int64_t>();
    const T* pdy = dy.data<T>();
    T* pt = dtable->data<T>();
    ParallelFor(D, MinChunk(n), [&](int64_t begin, int64_t end) {
      for (int64_t i = 0; i < n; ++i) {
        T* row = pt + pid[i] * D;
        const T* src = pdy + i * D;
        for (int64_t j = begin; j < end; ++j) row[j] += src[j];
      }
    });
    return absl::OkStatus();
  }
};

STRATA_REGISTER_KERNEL("embedding", DEVICE_CPU, F32, InitFactory<EmbeddingKernel<float>>());
STRATA_REGISTER_KERNEL("embedding", DEVICE_CPU, F64, InitFactory<EmbeddingKernel<double>>());
STRATA_REGISTER_KERNEL("embedding_grad", DEVICE_CPU, F32, InitFactory<EmbeddingGradKernel<float>>());
STRATA_REGISTER_KERNEL("embedding_grad", DEVICE_CPU, F64, InitFactory<EmbeddingGradKernel<double>>());

}  // namespace
}  // namespace strata
