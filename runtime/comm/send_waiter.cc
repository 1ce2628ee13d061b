#include "runtime/comm/send_waiter.h"

namespace strata {

SendWaiter::SendWaiter(absl::Duration timeout) : timeout_(timeout), thread_([this] { Loop(); }) {}

SendWaiter::~SendWaiter() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void SendWaiter::Add(std::unique_ptr<Work> work) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(work));
}

void SendWaiter::Loop() {
  while (true) {
    std::unique_ptr<Work> work;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;
      work = std::move(queue_.front());
      queue_.pop_front();
      ++in_flight_;
    }
    absl::Status s = work->Wait(timeout_);
    work.reset();  // releases the sent buffer
    absl::MutexLock lock(&mu_);
    --in_flight_;
    if (!s.ok() && first_error_.ok()) first_error_ = s;
  }
}

absl::Status SendWaiter::Drain() {
  absl::MutexLock lock(&mu_);
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return queue_.empty() && in_flight_ == 0; };
  mu_.Await(absl::Condition(&drained));
  absl::Status s = first_error_;
  first_error_ = absl::OkStatus();
  return s;
}

}  // namespace strata
