#ifndef STRATA_RUNTIME_COMM_SEND_WAITER_H_
#define STRATA_RUNTIME_COMM_SEND_WAITER_H_

#include <deque>
#include <memory>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/comm/communicator.h"

namespace strata {

// Waits for posted sends on a thread of its own, in the order they were
// posted, and drops each as soon as it completes, so a sent activation's
// buffer is freed when its receiver has it rather than at the end of the step
// (Gloo has no non-blocking completion test: only Wait tells).
class SendWaiter {
 public:
  explicit SendWaiter(absl::Duration timeout);
  ~SendWaiter();
  void Add(std::unique_ptr<Work> work);
  // Blocks until every added send has completed; the first error, if any.
  absl::Status Drain();

 private:
  void Loop();
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::deque<std::unique_ptr<Work>> queue_ ABSL_GUARDED_BY(mu_);
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace strata

#endif  // STRATA_RUNTIME_COMM_SEND_WAITER_H_
