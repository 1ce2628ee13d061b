// Registers libnccl's NcclApi as the binary's (alwayslink): `strata_gpu run
// --nproc N --device gpu` with a GPU per rank runs the collectives over it.

#include "runtime/comm/device_collectives.h"
#include "runtime/cuda/cuda_nccl_api.h"

namespace strata {
namespace {

const bool registered = RegisterNcclApiFactory([] { return NewCudaNcclApi(); });

}  // namespace
}  // namespace strata
