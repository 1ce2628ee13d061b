// dropout and dropout_grad: y = x * mask / (1 - p), the mask drawn from a
// counter-based Philox stream so that any split of the batch (micro-batches,
// data-parallel shards, recompute, the backward op) redraws the same bits.
//
// Stream: key = MixKey(run.seed, op.uid()); element e of global sample s has
// linear index L = s * elements_per_sample + e (s = run.sample_offset + row
// along dim 0), and takes lane L % 4 of Philox.Uniform4(hi = run.step,
// lo = L / 4). It is kept when that uniform is >= p. In a training step the
// executor's RunContext::random_counters carry (step, sample_offset).
//
// Threads: parallel over element ranges; each element's mask is a pure
// function of its index, so the split does not matter.

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/attr_kernels.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "runtime/kernel.h"
#include "runtime/philox.h"
#include "runtime/thread_pool.h"

namespace strata {
namespace {

using nn_kernels::InitFactory;

// out[i] = in[i] * keep(base + i) / (1 - p) for i in [0, n).
template <typename T>
void ApplyMask(const RunContext& run, int64_t uid, double p, uint64_t step, int64_t base, int64_t n, const T* in,
               T* out) {
  const Philox philox(MixKey(run.seed, static_cast<uint64_t>(uid)));
  const T scale = static_cast<T>(1.0 / (1.0 - p));
  ParallelFor(n, nn_kernels::kParallelGrain, [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    while (i < end) {
      const uint64_t linear = static_cast<uint64_t>(base + i);
      const auto u = philox.Uniform4(step, linear / 4);
      // The rest of this group of four, within [begin, end).
      for (uint64_t lane = linear % 4; lane < 4 && i < end; ++lane, ++i) {
        out[i] = u[lane] >= p ? in[i] * scale : T(0);
      }
    }
  });
}

// Shared by dropout (x -> y) and dropout_grad (dy -> dx): the same mask, scaled the same way.
template <typename T>
class DropoutKernel : public DropoutAttrsKernel {
 public:
  using DropoutAttrsKernel::DropoutAttrsKernel;

  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const RunContext& run = ctx.run();
    if (!run.training || p_ == 0.0) {
      ctx.SetOutput(0, x);  // evaluation (or nothing to drop): the identity, sharing x's buffer
      return absl::OkStatus();
    }
    STRATA_ASSIGN_OR_RETURN(Tensor * y, ctx.AllocateOutput(0, x.dtype(), x.shape()));
    const int64_t n = x.num_elements();
    if (n == 0) return absl::OkStatus();
    const int64_t per_sample = x.rank() == 0 ? 1 : n / x.dim(0);
    // The executor's counters where it wrote them (the host's memory here),
    // as the CUDA kernel reads them; the RunContext's fields otherwise.
    const int64_t* counters = run.random_counters;
    const int64_t step = counters != nullptr ? counters[0] : run.step;
    const int64_t sample_offset = counters != nullptr ? counters[1] : run.sample_offset;
    ApplyMask<T>(run, uid_, p_, static_cast<uint64_t>(step), sample_offset * per_sample, n, x.data<T>(),
                 y->data<T>());
    return absl::OkStatus();
  }
};

STRATA_REGISTER_KERNEL("dropout", DEVICE_CPU, F32, InitFactory<DropoutKernel<float>>());
STRATA_REGISTER_KERNEL("dropout", DEVICE_CPU, F64, InitFactory<DropoutKernel<double>>());
STRATA_REGISTER_KERNEL("dropout_grad", DEVICE_CPU, F32, InitFactory<DropoutKernel<float>>());
STRATA_REGISTER_KERNEL("dropout_grad", DEVICE_CPU, F64, InitFactory<DropoutKernel<double>>());

}  // namespace
}  // namespace strata
