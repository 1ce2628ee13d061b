// send, recv, allreduce, bucket_allreduce and bucket_wait on a GPU: the same
// device-neutral kernels as the CPU's (kernels/comm_kernels.h), with the
// CPU's dtypes. Device tensors reach the communicator, which stages them
// through pinned host memory (StagedCommunicator over Gloo). Also
// copy_to_device and copy_to_host: asynchronous copies on the compute stream.

#include "kernels/comm_kernels.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

STRATA_REGISTER_KERNEL("send", DEVICE_CUDA, F32, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CUDA, F32, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CUDA, F64, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CUDA, F64, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CUDA, I64, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CUDA, I64, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CUDA, I32, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CUDA, I32, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CUDA, BOOL, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CUDA, BOOL, RecvKernelFactory());
STRATA_REGISTER_KERNEL("allreduce", DEVICE_CUDA, F32, AllReduceKernelFactory());
STRATA_REGISTER_KERNEL("allreduce", DEVICE_CUDA, F64, AllReduceKernelFactory());
STRATA_REGISTER_KERNEL("bucket_allreduce", DEVICE_CUDA, F32, BucketAllReduceKernelFactory());
STRATA_REGISTER_KERNEL("bucket_allreduce", DEVICE_CUDA, F64, BucketAllReduceKernelFactory());
STRATA_REGISTER_KERNEL("bucket_wait", DEVICE_CUDA, F32, BucketWaitKernelFactory());
STRATA_REGISTER_KERNEL("bucket_wait", DEVICE_CUDA, F64, BucketWaitKernelFactory());

// The host-transfers pass's copies: bytes, one kernel for every dtype.
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CUDA, F32, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CUDA, F32, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CUDA, F64, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CUDA, F64, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CUDA, I64, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CUDA, I64, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CUDA, I32, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CUDA, I32, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CUDA, BOOL, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CUDA, BOOL, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CUDA, BF16, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CUDA, BF16, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CUDA, F16, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CUDA, F16, CopyToHostKernelFactory());

}  // namespace
}  // namespace strata
