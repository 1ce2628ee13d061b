#include "runtime/comm/communicator.h"

#include "absl/strings/str_cat.h"

namespace strata {

std::string CommOpTypeName(CommOpType op) {
  switch (op) {
    case CommOpType::kSend:
      return "send";
    case CommOpType::kRecv:
      return "recv";
    case CommOpType::kAllReduce:
      return "allreduce";
    case CommOpType::kBroadcast:
      return "broadcast";
    case CommOpType::kAllGather:
      return "allgather";
    case CommOpType::kReduceScatter:
      return "reduce_scatter";
    case CommOpType::kBarrier:
      return "barrier";
  }
  return "unknown";
}

std::string ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "unknown";
}

std::string Communicator::GraphBlocker() const {
  return absl::StrCat(backend(), " moves tensors on the host, outside the device's streams");
}

}  // namespace strata
