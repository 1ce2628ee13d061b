// allreduce, bucket_allreduce and bucket_wait on the CPU: the device-neutral
// kernels of kernels/allreduce.cc.

#include "kernels/comm_kernels.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

STRATA_REGISTER_KERNEL("allreduce", DEVICE_CPU, F32, AllReduceKernelFactory());
STRATA_REGISTER_KERNEL("allreduce", DEVICE_CPU, F64, AllReduceKernelFactory());
STRATA_REGISTER_KERNEL("bucket_allreduce", DEVICE_CPU, F32, BucketAllReduceKernelFactory());
STRATA_REGISTER_KERNEL("bucket_allreduce", DEVICE_CPU, F64, BucketAllReduceKernelFactory());
STRATA_REGISTER_KERNEL("bucket_wait", DEVICE_CPU, F32, BucketWaitKernelFactory());
STRATA_REGISTER_KERNEL("bucket_wait", DEVICE_CPU, F64, BucketWaitKernelFactory());

}  // namespace
}  // namespace strata
