#ifndef STRATA_RUNTIME_CUDA_CUDA_NCCL_API_H_
#define STRATA_RUNTIME_CUDA_CUDA_NCCL_API_H_

// The real NcclApi: libnccl and cudart. Errors are Internal statuses naming
// the call and NCCL's own string; ncclRemoteError and ncclSystemError (a
// peer gone, a socket closed) are Unavailable with kConnectionLost's words,
// as Gloo's lost connections are, so the launcher tells them apart.

#include <memory>

#include "runtime/comm/nccl_api.h"

namespace strata {

std::shared_ptr<NcclApi> NewCudaNcclApi();

}  // namespace strata

#endif  // STRATA_RUNTIME_CUDA_CUDA_NCCL_API_H_
