#ifndef STRATA_KERNELS_COMM_KERNELS_H_
#define STRATA_KERNELS_COMM_KERNELS_H_

// The communication ops' kernels, one for every device: they hand tensors to
// the rank's communicators (which stage device tensors through the host, or
// move them with NCCL), or copy between host and device memory, and touch
// tensor memory only through ctx.device(), so
// kernels/cpu/send_recv.cc, kernels/cpu/allreduce.cc and
// kernels/cuda/cuda_comm_ops.cc register these same kernels.

#include "runtime/kernel.h"

namespace strata {

// send / recv (send_recv.cc): pipeline transfers on the world's communicator.
KernelFactory SendKernelFactory();
KernelFactory RecvKernelFactory();

// allreduce, bucket_allreduce, bucket_wait (allreduce.cc): collectives over
// the op's communication group.
KernelFactory AllReduceKernelFactory();
KernelFactory BucketAllReduceKernelFactory();
KernelFactory BucketWaitKernelFactory();

// copy_to_device, copy_to_host (host_copy.cc): the host-transfers pass's
// copies between host and device memory.
KernelFactory CopyToDeviceKernelFactory();
KernelFactory CopyToHostKernelFactory();

}  // namespace strata

#endif  // STRATA_KERNELS_COMM_KERNELS_H_
