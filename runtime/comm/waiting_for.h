#ifndef STRATA_RUNTIME_COMM_WAITING_FOR_H_
#define STRATA_RUNTIME_COMM_WAITING_FOR_H_

// What this process is waiting for from its peers, for a message written on
// another thread: the heartbeat monitor that finds a peer stopped says what
// this rank was blocked on when it did ("allreduce of bucket 0 (2 gradients,
// F32[330]) over group 1 (dp: ranks 0, 1)"). One per process: the rank's
// training thread sets it around its waits.

#include <functional>
#include <string>

namespace strata {

// Says what this process waits for while it lives; the one before comes
// back when it ends. `describe` runs on the thread that asks (WaitingFor),
// only while this object lives: it may read state that its owner does not
// change during the wait.
class ScopedWaitingFor {
 public:
  explicit ScopedWaitingFor(std::string what);
  explicit ScopedWaitingFor(std::function<std::string()> describe);
  ~ScopedWaitingFor();
  ScopedWaitingFor(const ScopedWaitingFor&) = delete;
  ScopedWaitingFor& operator=(const ScopedWaitingFor&) = delete;

 private:
  std::function<std::string()> previous_;
};

// What the innermost live ScopedWaitingFor says; empty when none.
std::string WaitingFor();

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_WAITING_FOR_H_
