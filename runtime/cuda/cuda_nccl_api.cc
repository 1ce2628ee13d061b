#include "runtime/cuda/cuda_nccl_api.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata {
namespace {

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const std::string message = absl::StrCat("NCCL ", what, " failed: ", ncclGetErrorString(result));
  if (result == ncclRemoteError || result == ncclSystemError) {
    return absl::UnavailableError(absl::StrCat(message, " (", kConnectionLost, ")"));
  }
  return absl::InternalError(message);
}

absl::Status CudaCallStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, " failed: ", cudaGetErrorString(error)));
}

absl::StatusOr<ncclDataType_t> NcclType(DataType dtype) {
  switch (dtype) {
    case F32:
      return ncclFloat32;
    case F64:
      return ncclFloat64;
    case I32:
      return ncclInt32;
    case I64:
      return ncclInt64;
    case BF16:
      return ncclBfloat16;
    case F16:
      return ncclFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat("NCCL cannot reduce ", DataTypeName(dtype)));
  }
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  return ncclSum;
}

ncclComm_t C(NcclApi::Comm comm) { return static_cast<ncclComm_t>(comm); }
cudaStream_t S(StreamHandle stream) { return static_cast<cudaStream_t>(stream); }

class CudaNcclApi final : public NcclApi {
 public:
  int Version() const override {
    int version = 0;
    return ncclGetVersion(&version) == ncclSuccess ? version : 0;
  }

  absl::StatusOr<std::string> GetUniqueId() override {
    ncclUniqueId id;
    if (absl::Status s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
    static_assert(sizeof(id.internal) == kUniqueIdBytes, "NCCL_UNIQUE_ID_BYTES changed");
    return std::string(id.internal, sizeof(id.internal));
  }

  absl::StatusOr<Comm> CommInitRank(int ordinal, int nranks, const std::string& unique_id, int rank) override {
    if (unique_id.size() != kUniqueIdBytes) return absl::InvalidArgumentError("malformed NCCL unique id");
    if (absl::Status s = CudaCallStatus(cudaSetDevice(ordinal), "set device"); !s.ok()) return s;
    ncclUniqueId id;
    std::memcpy(id.internal, unique_id.data(), kUniqueIdBytes);
    ncclComm_t comm = nullptr;
    if (absl::Status s = NcclStatus(ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank"); !s.ok()) return s;
    return static_cast<Comm>(comm);
  }

  absl::Status Send(const void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) override {
    return NcclStatus(ncclSend(buffer, bytes, ncclUint8, peer, C(comm), S(stream)), "ncclSend");
  }
  absl::Status Recv(void* buffer, size_t bytes, int peer, Comm comm, StreamHandle stream) override {
    return NcclStatus(ncclRecv(buffer, bytes, ncclUint8, peer, C(comm), S(stream)), "ncclRecv");
  }
  absl::Status AllReduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, Comm comm,
                         StreamHandle stream) override {
    absl::StatusOr<ncclDataType_t> type = NcclType(dtype);
    if (!type.ok()) return type.status();
    return NcclStatus(ncclAllReduce(send, recv, count, *type, NcclOp(op), C(comm), S(stream)), "ncclAllReduce");
  }
  absl::Status Broadcast(const void* send, void* recv, size_t bytes, int root, Comm comm,
                         StreamHandle stream) override {
    return NcclStatus(ncclBroadcast(send, recv, bytes, ncclUint8, root, C(comm), S(stream)), "ncclBroadcast");
  }
  absl::Status AllGather(const void* send, void* recv, size_t bytes, Comm comm, StreamHandle stream) override {
    return NcclStatus(ncclAllGather(send, recv, bytes, ncclUint8, C(comm), S(stream)), "ncclAllGather");
  }
  absl::Status ReduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, Comm comm,
                             StreamHandle stream) override {
    absl::StatusOr<ncclDataType_t> type = NcclType(dtype);
    if (!type.ok()) return type.status();
    return NcclStatus(ncclReduceScatter(send, recv, count, *type, NcclOp(op), C(comm), S(stream)),
                      "ncclReduceScatter");
  }
  absl::Status GroupStart() override { return NcclStatus(ncclGroupStart(), "ncclGroupStart"); }
  absl::Status GroupEnd() override { return NcclStatus(ncclGroupEnd(), "ncclGroupEnd"); }

  absl::Status CommGetAsyncError(Comm comm) override {
    ncclResult_t async = ncclSuccess;
    if (absl::Status s = NcclStatus(ncclCommGetAsyncError(C(comm), &async), "ncclCommGetAsyncError"); !s.ok()) {
      return s;
    }
    return NcclStatus(async, "an operation (async error)");
  }
  absl::Status CommAbort(Comm comm) override { return NcclStatus(ncclCommAbort(C(comm)), "ncclCommAbort"); }
  absl::Status CommDestroy(Comm comm) override { return NcclStatus(ncclCommDestroy(C(comm)), "ncclCommDestroy"); }

  absl::StatusOr<StreamHandle> CreateStream(int ordinal) override {
    if (absl::Status s = CudaCallStatus(cudaSetDevice(ordinal), "set device"); !s.ok()) return s;
    cudaStream_t stream = nullptr;
    if (absl::Status s = CudaCallStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream create");
        !s.ok()) {
      return s;
    }
    return static_cast<StreamHandle>(stream);
  }
  void DestroyStream(StreamHandle stream) override {
    cudaStreamSynchronize(S(stream));
    cudaStreamDestroy(S(stream));
  }

  absl::StatusOr<Event> RecordEvent(StreamHandle stream) override {
    cudaEvent_t event = nullptr;
    if (absl::Status s = CudaCallStatus(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "event create");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CudaCallStatus(cudaEventRecord(event, S(stream)), "event record"); !s.ok()) {
      cudaEventDestroy(event);
      return s;
    }
    return static_cast<Event>(event);
  }
  absl::StatusOr<bool> EventDone(Event event) override {
    const cudaError_t error = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (error == cudaSuccess) return true;
    if (error == cudaErrorNotReady) {
      cudaGetLastError();  // not sticky; clear it
      return false;
    }
    return CudaCallStatus(error, "event query");
  }
  void DestroyEvent(Event event) override {
    if (event != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event));
  }
  absl::Status StreamWaitEvent(StreamHandle stream, Event event) override {
    return CudaCallStatus(cudaStreamWaitEvent(S(stream), static_cast<cudaEvent_t>(event), 0), "stream wait event");
  }
};

}  // namespace

std::shared_ptr<NcclApi> NewCudaNcclApi() { return std::make_shared<CudaNcclApi>(); }

}  // namespace strata
