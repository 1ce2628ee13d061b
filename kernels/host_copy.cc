// copy_to_device and copy_to_host, the host-transfers pass's ops: one kernel
// each for every device, moving bytes through ctx.device() only. On the host
// both are plain copies (a plan for a GPU run on the CPU's kernels trains the
// same); on a GPU they are asynchronous copies on the compute stream.

#include "absl/strings/str_cat.h"
#include "kernels/comm_kernels.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

// y (device memory, planned as an activation) = x (host memory). A feed
// its caller already put on this device (a benchmark's fixed batch, as the
// PyTorch side keeps one) is copied on the device.
class CopyToDeviceKernel : public OpKernel {
 public:
  explicit CopyToDeviceKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const bool on_this_device = x.device() == &ctx.device();
    if (!x.on_host() && !on_this_device) {
      return absl::InternalError(
          absl::StrCat("copy_to_device: input is on ", x.device()->name(), ", not the host or ", ctx.device().name()));
    }
    auto y = ctx.AllocateOutput(0, x.dtype(), x.shape());
    if (!y.ok()) return y.status();
    // From pageable memory the copy returns once x is staged; from
    // page-locked memory at once, the copy ordered before every kernel
    // that reads y.
    if (on_this_device) return ctx.device().CopyOnDevice((*y)->raw_data(), x.raw_data(), x.bytes());
    return ctx.device().CopyFromHost((*y)->raw_data(), x.raw_data(), x.bytes());
  }
};

// y (host memory, page-locked on a GPU) = x (device memory), not waited for:
// the executor reads y after the step's end synchronisation.
class CopyToHostKernel : public OpKernel {
 public:
  explicit CopyToHostKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    Tensor y = Tensor::Empty(x.dtype(), x.shape(), ctx.device().staging_allocator());
    if (!y.defined()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("copy_to_host: out of host memory for ", DataTypeName(x.dtype()), ShapeString(x.shape())));
    }
    if (absl::Status s = ctx.device().EnqueueCopyToHost(y.raw_data(), x.raw_data(), x.bytes()); !s.ok()) return s;
    ctx.SetOutput(0, std::move(y));
    return absl::OkStatus();
  }
};

}  // namespace

KernelFactory CopyToDeviceKernelFactory() { return MakeFactory<CopyToDeviceKernel>(); }
KernelFactory CopyToHostKernelFactory() { return MakeFactory<CopyToHostKernel>(); }

}  // namespace strata
