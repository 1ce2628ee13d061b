#include "runtime/comm/health.h"

#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace strata {

std::string HealthKeyPrefix(const std::string& job_id) { return absl::StrCat(JobKeyPrefix(job_id), "/health"); }

absl::Status ReportFailure(Store& health_store, int rank, const std::string& message) {
  absl::StatusOr<int64_t> order = health_store.Add("failure/count", 1);
  if (!order.ok()) return order.status();
  return health_store.Set(absl::StrCat("failure/", *order), absl::StrCat(rank, "\t", message));
}

absl::StatusOr<std::vector<FailureReport>> ReadFailures(Store& health_store, absl::Duration timeout) {
  absl::StatusOr<int64_t> count = health_store.Add("failure/count", 0);
  if (!count.ok()) return count.status();
  std::vector<FailureReport> failures;
  for (int64_t i = 1; i <= *count; ++i) {
    // A rank numbered its failure but died before writing it: skip it.
    absl::StatusOr<std::string> value = health_store.Get(absl::StrCat("failure/", i), timeout);
    if (!value.ok()) continue;
    std::pair<std::string, std::string> parts = absl::StrSplit(*value, absl::MaxSplits('\t', 1));
    FailureReport f;
    f.order = i;
    if (!absl::SimpleAtoi(parts.first, &f.rank)) continue;
    f.message = parts.second;
    failures.push_back(std::move(f));
  }
  return failures;
}

absl::StatusOr<std::unique_ptr<HeartbeatMonitor>> HeartbeatMonitor::Start(Options options) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size ||
      options.interval <= absl::ZeroDuration() || options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("heartbeat: bad rank, world size, interval or timeout");
  }
  // Its own connection (a Store serves one thread), whose calls give up within
  // an interval so that a store that stopped answering is noticed.
  absl::StatusOr<std::unique_ptr<Store>> root = OpenStore(options.store_spec, false, options.interval);
  if (!root.ok()) return absl::Status(root.status().code(), absl::StrCat("heartbeat: ", root.status().message()));
  std::unique_ptr<HeartbeatMonitor> monitor(new HeartbeatMonitor(std::move(options)));
  monitor->store_ = (*root)->WithPrefix(HealthKeyPrefix(monitor->options_.job_id));
  const std::string mine = absl::StrCat("heartbeat/", monitor->options_.rank);
  if (absl::StatusOr<int64_t> beat = monitor->store_->Add(mine, 1); !beat.ok()) {
    return absl::Status(beat.status().code(), absl::StrCat("heartbeat: ", beat.status().message()));
  }
  monitor->thread_ = std::thread([m = monitor.get()] { m->Run(); });
  return monitor;
}

HeartbeatMonitor::~HeartbeatMonitor() { Stop(); }

void HeartbeatMonitor::Stop() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (thread_.joinable()) thread_.join();
}

void HeartbeatMonitor::Finish() {
  Stop();
  store_->Add(absl::StrCat("finished/", options_.rank), 1).IgnoreError();
}

void HeartbeatMonitor::Run() {
  const Options& o = options_;
  const std::string mine = absl::StrCat("heartbeat/", o.rank);
  std::vector<int64_t> last(o.world_size, -1);
  std::vector<absl::Time> moved(o.world_size, absl::Now());
  std::vector<bool> finished(o.world_size, false);
  absl::Time store_answered = absl::Now();
  // Recorded as this rank's failure (the first one, unless another rank's
  // came before), then handed to the owner.
  auto report = [&](int rank, std::string why) {
    if (o.waiting_for) {
      if (std::string waiting = o.waiting_for(); !waiting.empty()) {
        absl::StrAppend(&why, "; rank ", o.rank, " was waiting for ", waiting);
      }
    }
    ReportFailure(*store_, o.rank, absl::StrCat("rank ", o.rank, ": ", why)).IgnoreError();
    if (o.on_unresponsive) o.on_unresponsive(rank, why);
  };
  while (!stop_.WaitForNotificationWithTimeout(o.interval)) {
    const absl::Time now = absl::Now();
    absl::StatusOr<int64_t> beat = store_->Add(mine, 1);
    if (!beat.ok()) {
      if (absl::Now() - store_answered > o.timeout) {
        report(o.store_owner, absl::StrCat("the store stopped answering for ",
                                           absl::FormatDuration(absl::Trunc(absl::Now() - store_answered, absl::Seconds(1))),
                                           o.store_owner >= 0 ? absl::StrCat(" (rank ", o.store_owner, " serves it)") : "",
                                           ": ", beat.status().message()));
        return;
      }
      continue;
    }
    store_answered = absl::Now();
    for (int r = 0; r < o.world_size; ++r) {
      if (r == o.rank || finished[r]) continue;
      absl::StatusOr<int64_t> done = store_->Add(absl::StrCat("finished/", r), 0);
      absl::StatusOr<int64_t> seen = store_->Add(absl::StrCat("heartbeat/", r), 0);
      if (!done.ok() || !seen.ok()) break;  // the store's own silence is judged above
      if (*done > 0) {
        finished[r] = true;
        continue;
      }
      if (*seen != last[r]) {
        last[r] = *seen;
        moved[r] = now;
      } else if (now - moved[r] > o.timeout) {
        report(r, absl::StrCat("rank ", r, " is unresponsive: its heartbeat stopped ",
                               absl::FormatDuration(absl::Trunc(now - moved[r], absl::Seconds(1))),
                               " ago (--heartbeat_timeout_s ", absl::ToDoubleSeconds(o.timeout), ")"));
        return;
      }
    }
  }
}

}  // namespace strata
