#ifndef STRATA_RUNTIME_FAULT_INJECTION_H_
#define STRATA_RUNTIME_FAULT_INJECTION_H_

// Test hooks, so that tests fail a run at a chosen point instead of racing a
// kill against it: STRATA_FAULT=POINT[:rank=R][:step=N][:seconds=S].
// Points:
//   checkpoint_partial_write  a rank exits after half of its checkpoint file
//   checkpoint_before_agree   a rank exits with its file durable, before the ranks agree
//   slow_step                 a rank sleeps S seconds (default 10) before step N:
//                             slow but alive, its heartbeat goes on
//   bucket_allreduce_exit     a rank exits, as a crash would, where it posts the first
//                             gradient bucket it sums over its data-parallel group in
//                             step N (bucket 0 on one stage: buckets are numbered in the
//                             order backward finishes them), before posting it: its
//                             peers' sum of that bucket can never finish
//   bucket_allreduce_stall    the same rank stops there (SIGSTOP to itself): alive
//                             but still, its heartbeat stopped too, as on a hung
//                             machine; the peers wait for the bucket's sum

#include <cstdint>
#include <string_view>

namespace strata {

// The exit code of a process a fault point ended.
inline constexpr int kFaultExitCode = 86;

// Whether STRATA_FAULT names `point` for this rank and step; `seconds` gets
// its seconds= (when given).
bool FaultRequested(std::string_view point, int rank, int64_t step, double* seconds = nullptr);

// Says so on stderr and exits with kFaultExitCode at once; `where` (when
// given) says what the rank was doing ("in allreduce of bucket 0 ...").
[[noreturn]] void InjectedFault(std::string_view point, int rank, std::string_view where = {});

// Says so on stderr and stops this process (SIGSTOP to itself): it stays
// alive, every thread still, until something continues or kills it.
void InjectedStall(std::string_view point, int rank, std::string_view where = {});

}  // namespace strata

#endif  // STRATA_RUNTIME_FAULT_INJECTION_H_
