// send, recv, copy_to_device and copy_to_host on the CPU: the device-neutral
// kernels of kernels/send_recv.cc and kernels/host_copy.cc. Transfers move
// bytes; one kernel serves every dtype.

#include "kernels/comm_kernels.h"
#include "runtime/kernel.h"

namespace strata {
namespace {

STRATA_REGISTER_KERNEL("send", DEVICE_CPU, F32, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CPU, F32, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CPU, F64, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CPU, F64, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CPU, I64, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CPU, I64, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CPU, I32, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CPU, I32, RecvKernelFactory());
STRATA_REGISTER_KERNEL("send", DEVICE_CPU, BOOL, SendKernelFactory());
STRATA_REGISTER_KERNEL("recv", DEVICE_CPU, BOOL, RecvKernelFactory());

// The host-transfers pass's copies: bytes, one kernel for every dtype.
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CPU, F32, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CPU, F32, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CPU, F64, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CPU, F64, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CPU, I64, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CPU, I64, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CPU, I32, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CPU, I32, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CPU, BOOL, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CPU, BOOL, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CPU, BF16, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CPU, BF16, CopyToHostKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_device", DEVICE_CPU, F16, CopyToDeviceKernelFactory());
STRATA_REGISTER_KERNEL("copy_to_host", DEVICE_CPU, F16, CopyToHostKernelFactory());

}  // namespace
}  // namespace strata
