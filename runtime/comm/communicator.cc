#include "runtime/comm/communicator.h"

#include <algorithm>
#include <cstring>

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

absl::StatusOr<std::vector<std::string>> AllGatherStrings(Communicator& comm, const std::string& mine,
                                                          absl::Duration timeout) {
  const int size = comm.size();
  Tensor length = Tensor::Empty(I64, {1});
  Tensor lengths = Tensor::Zeros(I64, {size});
  if (!length.defined() || !lengths.defined()) return absl::ResourceExhaustedError("out of host memory");
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  if (absl::Status s = comm.AllGather(length, &lengths)->Wait(timeout); !s.ok()) return s;
  int64_t words = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t n = lengths.data<int64_t>()[r];
    if (n < 0 || n > (int64_t{1} << 30)) {
      return absl::DataLossError(absl::StrCat("rank ", r, " sent a string of ", n, " bytes"));
    }
    words = std::max(words, (n + 7) / 8);
  }
  // Every rank saw the same lengths: all empty, no rank gathers the bytes.
  if (words == 0) return std::vector<std::string>(size);
  Tensor text = Tensor::Zeros(I64, {words});
  Tensor all = Tensor::Zeros(I64, {size * words});
  if (!text.defined() || !all.defined()) return absl::ResourceExhaustedError("out of host memory");
  std::memcpy(text.raw_data(), mine.data(), mine.size());
  if (absl::Status s = comm.AllGather(text, &all)->Wait(timeout); !s.ok()) return s;
  std::vector<std::string> out(size);
  for (int r = 0; r < size; ++r) {
    out[r].assign(reinterpret_cast<const char*>(all.data<int64_t>() + r * words), lengths.data<int64_t>()[r]);
  }
  return out;
}

}  // namespace strata
