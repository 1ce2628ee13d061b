#ifndef STRATA_RUNTIME_TRACE_H_
#define STRATA_RUNTIME_TRACE_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace strata {

// Chrome trace events ("X" complete events) for one rank: every action,
// op and transfer with its start and duration. Timestamps are the machine's
// monotonic clock, so the files of several processes line up when merged.
class Tracer {
 public:
  explicit Tracer(int rank) : rank_(rank) {}

  static int64_t NowMicros() {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // CPU time of the calling thread: what an action computed, without the time
  // it waited or shared its core.
  static int64_t ThreadCpuMicros();
  // category: "action", "op", "comm"; cpu_us < 0: not recorded; bytes < 0:
  // none (a transfer's payload).
  void Add(std::string name, const char* category, int64_t start_us, int64_t end_us, int64_t cpu_us = -1,
           int64_t bytes = -1);
  // {"traceEvents": [...]} with one track (tid) for this rank.
  absl::Status Write(const std::string& path) const;
  size_t size() const;

 private:
  struct Event {
    std::string name;
    const char* category;
    int64_t start_us, duration_us, cpu_us, bytes;
  };
  const int rank_;
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
};

// Joins per-rank trace files into one (the job's trace), removing the parts.
absl::Status MergeTraceFiles(const std::vector<std::string>& parts, const std::string& path);

}  // namespace strata

#endif  // STRATA_RUNTIME_TRACE_H_
