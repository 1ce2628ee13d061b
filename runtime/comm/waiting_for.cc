#include "runtime/comm/waiting_for.h"

#include <utility>

#include "absl/synchronization/mutex.h"

namespace strata {
namespace {

struct State {
  absl::Mutex mu;
  std::function<std::string()> describe ABSL_GUARDED_BY(mu);
};

State& GetState() {
  static State* state = new State();  // never destroyed: other threads may read it at exit
  return *state;
}

}  // namespace

ScopedWaitingFor::ScopedWaitingFor(std::string what) : ScopedWaitingFor([what = std::move(what)] { return what; }) {}

ScopedWaitingFor::ScopedWaitingFor(std::function<std::string()> describe) {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  previous_ = std::exchange(s.describe, std::move(describe));
}

ScopedWaitingFor::~ScopedWaitingFor() {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);
  s.describe = std::move(previous_);
}

std::string WaitingFor() {
  State& s = GetState();
  absl::MutexLock lock(&s.mu);  // held while describing: the waiter's scope cannot end meanwhile
  return s.describe ? s.describe() : std::string();
}

}  // namespace strata
