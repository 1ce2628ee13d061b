// send and recv on the CPU: the device-neutral kernels of
// kernels/send_recv.cc. Transfers move bytes; one kernel serves every dtype.

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

}  // namespace
}  // namespace strata
