#include "runtime/fault_injection.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace strata {

bool FaultRequested(std::string_view point, int rank, int64_t step, double* seconds) {
  const char* spec = std::getenv("STRATA_FAULT");
  if (spec == nullptr) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  if (parts.empty() || parts[0] != absl::string_view(point.data(), point.size())) return false;
  for (size_t i = 1; i < parts.size(); ++i) {
    int64_t v;
    double s;
    if (absl::ConsumePrefix(&parts[i], "rank=") && absl::SimpleAtoi(parts[i], &v) && v != rank) return false;
    if (absl::ConsumePrefix(&parts[i], "step=") && absl::SimpleAtoi(parts[i], &v) && v != step) return false;
    if (absl::ConsumePrefix(&parts[i], "seconds=") && absl::SimpleAtod(parts[i], &s) && seconds != nullptr) {
      *seconds = s;
    }
  }
  return true;
}

void InjectedFault(std::string_view point, int rank, std::string_view where) {
  std::fprintf(stderr, "error: rank %d: fault injected at %s (STRATA_FAULT)%s%s\n", rank, std::string(point).c_str(),
               where.empty() ? "" : " ", std::string(where).c_str());
  std::fflush(stderr);
  _exit(kFaultExitCode);
}

void InjectedStall(std::string_view point, int rank, std::string_view where) {
  // Not an error line: the stalled rank reports nothing, the others find it.
  std::fprintf(stderr, "note: rank %d: fault injected at %s (STRATA_FAULT)%s%s: stopping (SIGSTOP)\n", rank,
               std::string(point).c_str(), where.empty() ? "" : " ", std::string(where).c_str());
  std::fflush(stderr);
  raise(SIGSTOP);
}

}  // namespace strata
