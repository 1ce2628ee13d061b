#include "runtime/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "proto/metrics_keys.h"
#include "proto/roles.h"
#include "proto/status_macros.h"
#include "runtime/checkpoint.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/communicator_set.h"
#include "runtime/dataset.h"
#include "runtime/executor.h"
#include "runtime/fault_injection.h"
#include "runtime/json_line.h"
#include "runtime/prefetcher.h"
#include "runtime/trace.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// A metric as the --metrics lines have always carried it: 10 significant
// digits, and null for NaN and the infinities, which JSON cannot hold (a
// step's loss is finite, or training stops; a fetch or an evaluation's loss
// may not be).
nlohmann::ordered_json Metric(double v) {
  if (!std::isfinite(v)) return nullptr;
  double rounded = v;
  absl::SimpleAtod(absl::StrFormat("%.10g", v), &rounded);
  return rounded;
}

std::string FormatDuration(double s) {
  if (s < 60) return absl::StrFormat("%.0fs", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  return absl::StrFormat("%dh%02dm", static_cast<int>(s) / 3600, (static_cast<int>(s) / 60) % 60);
}

class MetricsWriter {
 public:
  absl::Status Open(const std::string& path, bool append) {
    if (path.empty()) return absl::OkStatus();
    path_ = path;
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!out_) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open --metrics file for writing"));
    return absl::OkStatus();
  }
  // Writes and flushes one line; a line that cannot be written (a full
  // disk, /dev/full) is an error, not metrics silently lost.
  absl::Status Line(const std::string& json) {
    if (!out_.is_open()) return absl::OkStatus();
    out_ << json << "\n";
    out_.flush();
    if (!out_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("--metrics ", path_, ": write failed (", std::strerror(errno), ")"));
    }
    return absl::OkStatus();
  }

 private:
  std::string path_;
  std::ofstream out_;
};

// Every rank opens the data with all the program's feeds, so all ranks see
// the same samples in the same order; each binds the ones it reads.
std::vector<FeedSpec> FeedSpecs(const Program& program) {
  std::vector<FeedSpec> specs;
  for (const Var& v : program.var()) {
    if (v.kind() == FEED)
      specs.push_back({v.name(), v.dtype(), std::vector<int64_t>(v.shape().begin(), v.shape().end())});
  }
  return specs;
}

// Every rank loads every feed (so all see the same samples, and synthetic
// labels come from all features); a pipeline stage keeps only what it reads.
void DropUnreadFeeds(const Executor& executor, std::map<std::string, Tensor>* feeds) {
  for (auto it = feeds->begin(); it != feeds->end();) {
    bool read = false;
    for (const Var* v : executor.feeds()) read |= v->name() == it->first;
    it = read ? std::next(it) : feeds->erase(it);
  }
}

// The feeds a rank reads, loaded in the loader's memory, moved into the
// rank's own memory, where its plan counts them. A GPU plan's host feeds go
// to page-locked memory instead (the device's staging allocator, which
// reuses a block only once the stream has passed its free), so its
// copy_to_device ops enqueue without the host waiting for the copy.
absl::Status IntoRankMemory(const Executor& executor, Device* device, std::map<std::string, Tensor>* feeds) {
  DropUnreadFeeds(executor, feeds);
  for (const Var* v : executor.feeds()) {
    auto it = feeds->find(v->name());
    if (it == feeds->end()) continue;
    if (v->host_memory()) {
      if (device->host_accessible()) continue;
      Tensor pinned = it->second.Clone(device->staging_allocator());
      if (!pinned.defined()) {
        return absl::ResourceExhaustedError(absl::StrCat("out of page-locked host memory for feed ", v->name()));
      }
      it->second = std::move(pinned);
      continue;
    }
    absl::StatusOr<Tensor> copy = it->second.CopyTo(device);
    if (!copy.ok()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for feed ", v->name()));
    it->second = *std::move(copy);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, Tensor>> LoadBatch(const Dataset& data, absl::Span<const int64_t> indices) {
  std::vector<Tensor> tensors;
  if (auto s = data.GetBatch(indices, &tensors); !s.ok()) return s;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < data.feeds().size(); ++i) feeds[data.feeds()[i].name] = std::move(tensors[i]);
  return feeds;
}

// The global batch a plan's step takes: micro-batches across the
// data-parallel replicas.
int64_t PlanBatchSize(const RankPlan& plan) {
  return plan.schedule().micro_batch_size() * std::max(1, plan.schedule().micro_batches()) *
         std::max(1, plan.topology().dp_degree());
}

// Sums `values` over a group (data-parallel or pipeline), in place (a no-op
// without one); `what` names the values and the group for an error.
absl::Status SumOverGroup(Communicator* group, std::vector<double>& values, double timeout_s, const std::string& what) {
  if (group == nullptr || values.empty()) return absl::OkStatus();
  Tensor t = Tensor::Empty(F64, {static_cast<int64_t>(values.size())});
  if (!t.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory summing ", what));
  std::copy(values.begin(), values.end(), t.data<double>());
  if (auto s = group->AllReduce(&t, ReduceOp::kSum)->Wait(absl::Seconds(timeout_s)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("summing ", what, ": ", s.message()));
  }
  std::copy(t.data<double>(), t.data<double>() + values.size(), values.begin());
  return absl::OkStatus();
}

// The data set in batches of `batch` (0: the plan's micro-batch on each
// replica); data-parallel rank d of D evaluates the d-th contiguous slice of
// each, and the group sums what it saw, so every rank reports the single
// device's numbers. The batches run as one pipelined forward-only pass (a
// stage goes on while the next takes its outputs); each batch's feeds go into
// the rank's memory when its forward starts, as a training micro-batch's do,
// so an evaluation stays inside the plan.
absl::StatusOr<EvalMetrics> RunEvaluation(Executor& executor, Device* device, const Dataset& data,
                                          const std::string& name, int64_t batch, const std::string& acc_fetch,
                                          Communicator* dp, Communicator* relay, double timeout_s) {
  EvalMetrics m;
  m.name = name;
  const int64_t degree = std::max(1, executor.plan().topology().dp_degree());
  const int64_t dp_rank = executor.plan().topology().dp_rank();
  if (batch <= 0) batch = std::max<int64_t>(1, executor.plan().schedule().micro_batch_size()) * degree;
  // This replica's share of each batch, all in one pipelined run.
  std::vector<Executor::EvalMicroBatch> micro_batches;
  for (int64_t begin = 0; begin < data.size(); begin += batch) {
    const int64_t total = std::min(batch, data.size() - begin);
    const int64_t first = begin + total * dp_rank / degree;
    const int64_t n = begin + total * (dp_rank + 1) / degree - first;
    if (n == 0) continue;  // a last batch smaller than the group (every stage of this replica skips it)
    micro_batches.push_back({first, n});
  }
  std::vector<int64_t> indices;
  auto results = executor.Evaluate(micro_batches, [&](int m) -> absl::StatusOr<std::map<std::string, Tensor>> {
    indices.resize(micro_batches[m].rows);
    std::iota(indices.begin(), indices.end(), micro_batches[m].first_sample);
    auto feeds = LoadBatch(data, indices);
    if (!feeds.ok()) return feeds.status();
    STRATA_RETURN_IF_ERROR(IntoRankMemory(executor, device, &*feeds));
    return feeds;
  });
  if (!results.ok()) return results.status();
  // A loss that is a mean over samples: each batch's weighted by its
  // samples. A sum over them: the set's total, reported per sample times the
  // samples of an update (the global batch, times gradient merge's steps),
  // so no split of the evaluation's batches changes it and it equals the
  // evaluation of one device training on the update's batch.
  const bool summed_loss = executor.plan().summed_loss();
  double loss_sum = 0, acc_sum = 0;
  int64_t seen = 0;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const StepResult& r = (*results)[m];
    const int64_t n = micro_batches[m].rows;
    loss_sum += summed_loss ? r.loss : r.loss * n;
    if (!acc_fetch.empty()) {
      auto acc = r.fetches.find(acc_fetch);
      // The accuracy op's value is a count over n, rounded once to its
      // dtype (37/40 in float32 is 0.92500001): the count itself is summed,
      // so the set's accuracy prints 0.376, not 0.3760000005.
      if (acc != r.fetches.end()) acc_sum += std::round(acc->second * static_cast<double>(n));
    }
    seen += n;
  }
  // An accuracy made off the loss's stage (a relayed fetch; the same list
  // and accuracy fetch on every rank, so all of the pipeline group enter or
  // none): its stage's sum reaches the loss's stage as a step's fetches do.
  const RankPlan& plan = executor.plan();
  const auto relayed = std::find_if(plan.relayed_fetch().begin(), plan.relayed_fetch().end(),
                                    [&](const RankPlan::RelayedFetch& f) { return f.name() == acc_fetch; });
  if (relay != nullptr && !acc_fetch.empty() && relayed != plan.relayed_fetch().end()) {
    std::vector<double> sum = {relayed->stage() == plan.topology().stage() ? acc_sum : 0.0};
    STRATA_RETURN_IF_ERROR(SumOverGroup(relay, sum, timeout_s, "the evaluation's accuracy over the pipeline group"));
    acc_sum = sum[0];
  }
  std::vector<double> sums = {loss_sum, acc_sum, static_cast<double>(seen)};
  STRATA_RETURN_IF_ERROR(SumOverGroup(dp, sums, timeout_s, "the evaluation over the data-parallel group"));
  m.loss = sums[0] / std::max(sums[2], 1.0);
  if (summed_loss) m.loss *= PlanBatchSize(executor.plan()) * std::max(1, executor.plan().schedule().merge_steps());
  m.accuracy = acc_fetch.empty() ? -1 : sums[1] / std::max(sums[2], 1.0);
  return m;
}

// This rank's data-parallel group's communicator; null without data parallelism.
absl::StatusOr<Communicator*> DataParallelCommunicator(const RankPlan& plan, const CommunicatorSet* comms) {
  if (comms == nullptr || plan.topology().dp_degree() <= 1) return nullptr;
  for (const CommGroup& g : plan.topology().group()) {
    // Host values (losses, evaluation sums): the host's transport, even
    // where the kernels' collectives go over NCCL.
    if (g.axis_size() == 1 && g.axis(0) == "dp") return comms->GetHost(g.id());
  }
  return absl::InternalError("the plan has a data-parallel degree but no dp group");
}

// This rank's pipeline group's communicator where the plan relays fetches
// to the loss's stage (RankPlan.relayed_fetch); null otherwise.
absl::StatusOr<Communicator*> RelayCommunicator(const RankPlan& plan, const CommunicatorSet* comms) {
  if (comms == nullptr || plan.relayed_fetch().empty() || plan.topology().num_stages() <= 1) return nullptr;
  for (const CommGroup& g : plan.topology().group()) {
    if (g.axis_size() == 1 && g.axis(0) == "pp") return comms->GetHost(g.id());
  }
  return absl::InternalError("the plan relays fetches between stages but has no pp group");
}

// The consumer of the fewest classes among `ranks`' (the lowest rank's on a
// tie); none where no rank has one.
LabelConsumer TightestLabelConsumer(const std::vector<LabelConsumer>& ranks) {
  LabelConsumer tightest;
  for (const LabelConsumer& c : ranks) {
    if (c.classes <= 0 || (tightest.classes > 0 && c.classes >= tightest.classes)) continue;
    tightest = c;
  }
  return tightest;
}

// What this plan's own ops bound the labels and token ids by: the label
// feed's consumer, or the token table where it takes fewer ids.
LabelConsumer PlanLabelConsumer(const Program& program, const std::vector<FeedSpec>& feeds) {
  LabelConsumer consumer;
  if (const std::string label_feed = LabelFeedName(feeds); !label_feed.empty()) {
    consumer = FindLabelConsumer(program, label_feed);
  }
  // Token ids index the embedding as well as the loss's classes: the tighter bounds both.
  if (const std::string token_feed = TokenFeedName(feeds); !token_feed.empty()) {
    const LabelConsumer table = FindTokenConsumer(program, token_feed);
    if (table.classes > 0 && (consumer.classes <= 0 || table.classes < consumer.classes)) consumer = table;
  }
  return consumer;
}

// --data and --eval_data opened for `feeds` (synthetic data without
// classes= has the program's), their labels checked against `consumer`.
absl::Status OpenJobData(const TrainOptions& options, const std::vector<FeedSpec>& feeds, const LabelConsumer& consumer,
                         std::unique_ptr<Dataset>* train, std::unique_ptr<Dataset>* eval) {
  // --eval_only reads no training data (`train` stays null).
  if (!options.eval_only) {
    auto train_data = OpenDataset(options.data, feeds, options.seed, consumer.classes);
    if (!train_data.ok()) {
      return absl::Status(train_data.status().code(),
                          absl::StrCat("--data ", options.data, ": ", train_data.status().message()));
    }
    *train = *std::move(train_data);
  }
  if (!options.eval_data.empty()) {
    auto d = OpenDataset(options.eval_data, feeds, options.seed, consumer.classes);
    if (!d.ok()) {
      return absl::Status(d.status().code(),
                          absl::StrCat("--eval_data ", options.eval_data, ": ", d.status().message()));
    }
    *eval = *std::move(d);
  }
  // Labels the program cannot take fail here, on every rank, before any step.
  if (*train) STRATA_RETURN_IF_ERROR(CheckLabelsFit(**train, consumer, absl::StrCat("--data ", options.data)));
  if (*eval) STRATA_RETURN_IF_ERROR(CheckLabelsFit(**eval, consumer, absl::StrCat("--eval_data ", options.eval_data)));
  return absl::OkStatus();
}

// An epoch's steps: whole updates of k steps (gradient merge), as the single
// device's epoch of k-times-larger batches holds; at least one.
absl::StatusOr<int64_t> StepsPerEpoch(const Dataset& data, const std::string& spec, int64_t batch, int64_t k) {
  const int64_t steps = data.size() / (batch * k) * k;
  if (steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--data ", spec, " has ", data.size(),
                                                   " samples, fewer than one batch of ", batch,
                                                   k > 1 ? absl::StrCat(" x gradient_merge.k_steps ", k) : ""));
  }
  return steps;
}

// Pipeline stages hold only their own ops, so the stage with the loss tells
// the others its classes: every rank ends with the tightest consumer of all
// ranks (the lowest rank's on a tie) and so fails the label check alike.
absl::StatusOr<LabelConsumer> ShareLabelConsumer(const LabelConsumer& mine, Communicator& comm, double timeout_s) {
  constexpr int64_t kWords = 128;  // the class count, then the description's bytes
  constexpr size_t kTextBytes = (kWords - 1) * sizeof(int64_t);
  Tensor in = Tensor::Empty(I64, {kWords});
  Tensor all = Tensor::Empty(I64, {comm.size() * kWords});
  if (!in.defined() || !all.defined()) return absl::ResourceExhaustedError("out of memory sharing the label classes");
  std::memset(in.raw_data(), 0, in.bytes());
  in.data<int64_t>()[0] = mine.classes;
  std::string text = mine.what;
  if (text.size() > kTextBytes) text = text.substr(0, kTextBytes - 3) + "...";
  std::memcpy(in.data<int64_t>() + 1, text.data(), text.size());
  if (auto s = comm.AllGather(in, &all)->Wait(absl::Seconds(timeout_s)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("sharing the label classes between ranks: ", s.message()));
  }
  std::vector<LabelConsumer> ranks(comm.size());
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* words = all.data<int64_t>() + r * kWords;
    const char* bytes = reinterpret_cast<const char*>(words + 1);
    ranks[r].classes = words[0];
    ranks[r].what = std::string(bytes, strnlen(bytes, kTextBytes));
  }
  return TightestLabelConsumer(ranks);
}

// What the metrics call an evaluation: its split ("test" for
// "fashion_mnist:test" and "synthetic:classes=3,test"), else the dataset.
std::string EvalName(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return spec;
  for (absl::string_view item : absl::StrSplit(absl::string_view(spec).substr(colon + 1), ',')) {
    if (item == "test" || item == "train") return std::string(item);
  }
  return spec.substr(0, colon);
}

// Every rank passes its own status; all get OK only when every rank's was OK,
// else the first failing rank's (by rank) is named.
absl::Status AgreeAllRanks(Communicator& comm, const absl::Status& mine, double timeout_s, absl::string_view what) {
  Tensor in = Tensor::Empty(I64, {1});
  Tensor all = Tensor::Empty(I64, {comm.size()});
  if (!in.defined() || !all.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory ", what));
  in.data<int64_t>()[0] = static_cast<int64_t>(mine.code());
  if (auto s = comm.AllGather(in, &all)->Wait(absl::Seconds(timeout_s)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  }
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t code = all.data<int64_t>()[r];
    if (code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(code),
                          r == comm.rank() ? std::string(mine.message()) : absl::StrCat("rank ", r, " failed ", what));
    }
  }
  return absl::OkStatus();
}

// How often the ranks agree whether to stop: a collective per step would
// cost a pipeline's small steps about a tenth of their time.
constexpr double kStopCheckPeriodSeconds = 0.5;

// Whether any rank caught a stop signal (the largest signal number any rank
// caught, agreed by every rank), and the step after which they next check:
// each rank proposes one about kStopCheckPeriodSeconds of its steps ahead
// and the furthest wins, so all check after the same steps.
struct StopCheck {
  int signal = 0;
  int64_t next_check = 0;
};

absl::StatusOr<StopCheck> AgreeOnStop(int mine, int64_t proposed_next_check, Communicator* comm, double timeout_s) {
  if (comm == nullptr || comm->size() <= 1) return StopCheck{mine, proposed_next_check};
  Tensor flags = Tensor::Empty(I64, {2});
  if (!flags.defined()) return absl::ResourceExhaustedError("out of memory agreeing on a stop");
  flags.data<int64_t>()[0] = mine;
  flags.data<int64_t>()[1] = proposed_next_check;
  if (auto s = comm->AllReduce(&flags, ReduceOp::kMax)->Wait(absl::Seconds(timeout_s)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("agreeing whether to stop: ", s.message()));
  }
  return StopCheck{static_cast<int>(flags.data<int64_t>()[0]), flags.data<int64_t>()[1]};
}

}  // namespace

// Ranks started by hand can be given different settings; training on them
// would hang (different step counts) or silently train the wrong model
// (different seeds or data). Every rank sends its settings to every other and
// all refuse, naming the first one that differs from rank 0's.
absl::Status AgreeOnSettings(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& settings,
                             double timeout_s) {
  std::string mine;
  for (const auto& [name, value] : settings)
    absl::StrAppend(&mine, name, "=", absl::StrReplaceAll(value, {{"\n", " "}}), "\n");
  absl::StatusOr<std::vector<std::string>> all = AllGatherStrings(comm, mine, absl::Seconds(timeout_s));
  if (!all.ok()) {
    return absl::Status(all.status().code(), absl::StrCat("comparing the ranks' settings: ", all.status().message()));
  }
  auto settings_of = [&](int r) {
    std::vector<std::pair<std::string, std::string>> out;
    for (absl::string_view line : absl::StrSplit((*all)[r], '\n', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(line, absl::MaxSplits('=', 1));
      out.push_back(std::move(kv));
    }
    return out;
  };
  const auto first = settings_of(0);
  for (int r = 1; r < comm.size(); ++r) {
    const auto other = settings_of(r);
    for (size_t i = 0; i < std::max(first.size(), other.size()); ++i) {
      const std::string name = i < first.size() ? first[i].first : other[i].first;
      const std::string a = i < first.size() ? first[i].second : "(none)";
      const std::string b = i < other.size() && other[i].first == name ? other[i].second : "(none)";
      if (a != b) {
        return absl::FailedPreconditionError(absl::StrCat("rank ", r, " has ", name, " ", b, " but rank 0 has ", name,
                                                          " ", a, ": every rank must run with the same settings"));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// A number in a checkpoint's metadata, at least `min`: nullopt where the key
// is absent (a save that did not write it), DataLoss where it is there but
// is no such number (a damaged or hand-edited file), so that a check reading
// it is never skipped silently.
template <typename Int>
absl::StatusOr<std::optional<Int>> MetadataInt(const std::map<std::string, std::string>& metadata,
                                               const std::string& key, Int min) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return std::nullopt;
  Int value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < min) {
    return absl::DataLossError(absl::StrCat("the checkpoint's metadata has ", key, " '", absl::CHexEscape(it->second),
                                            "', expected an integer from ", min));
  }
  return value;
}

// The gradient_merge.k_steps of the run that saved a checkpoint (1 where its
// metadata does not say).
absl::StatusOr<int64_t> SavedMergeSteps(const std::map<std::string, std::string>& metadata) {
  int64_t k = 1;
  if (auto it = metadata.find("merge_steps"); it != metadata.end() && (!absl::SimpleAtoi(it->second, &k) || k < 1)) {
    return absl::DataLossError(absl::StrCat("bad merge_steps '", it->second, "' in the checkpoint's metadata"));
  }
  return k;
}

}  // namespace

bool ScheduleSpansRun(const Program& program) {
  const Optimizer::LrSchedule& schedule = program.optimizer().lr_schedule();
  return schedule.has_cosine() && schedule.cosine().decay_steps() == 0;
}

namespace {

// The step a checkpoint was saved after.
absl::StatusOr<int64_t> SavedStep(const std::map<std::string, std::string>& metadata) {
  int64_t step = 0;
  auto it = metadata.find("step");
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &step) || step < 0) {
    return absl::InvalidArgumentError("checkpoint has no valid 'step'");
  }
  return step;
}

}  // namespace

// The checkpoint's step, if this run may resume from it: the same batch and
// seed (both decide the data order and dropout masks), and steps left to run.
absl::StatusOr<int64_t> CheckResumable(const std::map<std::string, std::string>& metadata, int64_t batch, uint64_t seed,
                                       int64_t total_steps, bool schedule_spans_run) {
  STRATA_ASSIGN_OR_RETURN(const int64_t step, SavedStep(metadata));
  STRATA_ASSIGN_OR_RETURN(const std::optional<int64_t> saved_batch, MetadataInt<int64_t>(metadata, "batch_size", 1));
  if (saved_batch.has_value() && *saved_batch != batch) {
    return absl::InvalidArgumentError(absl::StrCat("saved with batch size ", *saved_batch, ", resuming with ", batch,
                                                   " would change the data order"));
  }
  STRATA_ASSIGN_OR_RETURN(const std::optional<uint64_t> saved_seed, MetadataInt<uint64_t>(metadata, "seed", 0));
  if (saved_seed.has_value() && *saved_seed != seed) {
    return absl::InvalidArgumentError(absl::StrCat("saved with seed ", *saved_seed, ", resuming with ", seed,
                                                   " would change the data order and dropout masks"));
  }
  if (step >= total_steps) {
    return absl::OutOfRangeError(absl::StrCat("the checkpoint is at step ", step, " but the run ends at step ",
                                              total_steps, "; nothing left to train (--steps counts the whole run)"));
  }
  STRATA_ASSIGN_OR_RETURN(const std::optional<int64_t> saved_total_steps,
                          MetadataInt<int64_t>(metadata, "total_steps", 1));
  const int64_t saved_total = saved_total_steps.value_or(0);
  if (schedule_spans_run && saved_total_steps.has_value() && saved_total != total_steps) {
    // decay_steps counts optimizer updates: under gradient merge, one every k steps.
    const int64_t saved_k = SavedMergeSteps(metadata).value_or(1);
    return absl::InvalidArgumentError(absl::StrCat(
        "saved by a run of ", saved_total, " steps, over which the program's cosine learning rate decays; this run of ",
        total_steps, " steps would decay it over those instead. To keep the saved run's schedule, give the program's ",
        "lr_schedule.cosine decay_steps: ", saved_total / saved_k, " (its optimizer updates)",
        step < saved_total ? absl::StrCat(", or resume with --steps ", saved_total, " (they count the whole run)")
                           : ""));
  }
  return step;
}

absl::Status CheckWritableFile(const std::string& path, const std::string& flag) {
  const bool existed = access(path.c_str(), F_OK) == 0;
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(flag, " ", path, ": cannot write there: ", std::strerror(errno)));
  }
  close(fd);
  if (!existed) unlink(path.c_str());
  return absl::OkStatus();
}

std::string StepMetricsJson(const StepMetrics& m) {
  nlohmann::ordered_json line = {{"step", m.step}, {"epoch", m.epoch}, {"loss", Metric(m.loss)}};
  for (const auto& [name, value] : m.fetches) {
    // Validation refuses a fetch named like one of the line's own keys
    // (proto/metrics_keys.h) but the loss's own: the line's "loss" is it.
    if (!IsMetricsLineKey(name)) line[name] = Metric(value);
  }
  if (m.optimizer_step > 0) line["optimizer_step"] = m.optimizer_step;
  if (m.has_lr) line["lr"] = Metric(m.lr);
  // Not finite on an update loss scaling skips: null, as the loss would be.
  if (m.has_grad_norm) line["grad_norm"] = Metric(m.grad_norm);
  // The scale is a float32 power of the factors: written exactly, not to 10 digits.
  if (m.has_loss_scale) line["loss_scale"] = m.loss_scale;
  if (m.skipped_update) line["skipped_update"] = true;
  line["samples_per_sec"] = Metric(m.samples_per_sec);
  line["step_ms"] = Metric(m.step_ms);
  return JsonLine(line);
}

std::string EvalMetricsJson(const EvalMetrics& m, int64_t step) {
  nlohmann::ordered_json line = {{"eval", m.name}, {"step", step}, {"epoch", m.epoch}, {"loss", Metric(m.loss)}};
  if (m.accuracy >= 0) line["accuracy"] = Metric(m.accuracy);
  return JsonLine(line);
}

// The metadata key that says a saved buffer holds a part of a tied weight's
// gradient (Program.merge_part); its value is the whole's buffer name.
constexpr char kMergePartKey[] = "merge_part:";

namespace {

// One rank's training run, split into the phases Train calls in order. The
// members are declared in the order the run makes them, so they are
// destroyed in reverse: the prefetcher first (its thread reads the data and
// the executor), the datasets before the loader allocator their batches come
// from, the executor before the tracer it writes to.
class TrainSession {
 public:
  TrainSession(const RankPlan& plan, const TrainOptions& options)
      : plan_(plan),
        options_(options),
        t_begin_(Clock::now()),
        world_(options.comms != nullptr ? options.comms->world() : nullptr),
        holds_loss_(!plan.program().loss().empty()),
        // One rank of the data-parallel group holding the loss reports it.
        reporter_(holds_loss_ && plan.topology().dp_rank() == 0),
        progress_(options.progress && reporter_),
        acc_fetch_(plan.accuracy_fetch()),
        eval_name_(EvalName(options.eval_data)) {
    report_.reports_loss = reporter_;
  }

  // Before the first step: everything that can fail does, on every rank alike.
  absl::Status CreateExecutor();
  absl::Status FixBatchSize();
  absl::Status OpenData();
  absl::Status CountSteps();
  absl::Status CheckOutputsWritable() const;
  absl::Status InitializeState();
  absl::Status ResumeFromCheckpoint();
  absl::Status CheckSaveKeepsLatest() const;
  absl::Status CheckRanksAgreeOnSettings() const;
  absl::Status CheckSaveFolderShared() const;
  absl::Status OpenMetrics();

  // The steps, then what follows the last one.
  absl::Status RunSteps();
  absl::Status EvaluateAtEnd();
  absl::Status SaveAtEnd();
  absl::Status RecordFinalState();
  absl::Status WriteTrace() const;
  void StopClock() { report_.seconds = Seconds(t_begin_, Clock::now()); }
  absl::Status WriteSummary();
  TrainReport TakeReport() { return std::move(report_); }

 private:
  // What the summary line says of the job: its peak (on several ranks, the
  // rank that measured the most, with its prediction) and each rank's figures.
  struct JobSummary {
    nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
    int64_t peak_measured = 0;
    int64_t peak_predicted = 0;
    int64_t peak_reserved = -1;  // the measuring rank's; -1 on the CPU
  };

  // The allocator's peak since its last ResetPeak into the report, with the
  // device's reserved bytes beside it.
  void NoteMeasuredPeak() {
    report_.measured_peak_bytes = std::max(report_.measured_peak_bytes, options_.device->allocator()->peak_bytes());
    report_.peak_reserved_bytes = options_.device->peak_reserved_bytes();
  }

  absl::StatusOr<LabelConsumer> AgreedLabelConsumer(const std::vector<FeedSpec>& feeds) const;
  void StartPrefetcher();
  absl::StatusOr<std::map<std::string, Tensor>> MicroBatchFeeds(int64_t step, int64_t first, int64_t rows);
  absl::StatusOr<StepResult> RunStep(int64_t step);
  absl::Status RecordStep(int64_t step, double seconds, const StepResult& r);
  void ReportProgress(int64_t epoch, const StepResult& r);
  absl::StatusOr<bool> StopAgreed(bool now);
  bool PeriodicSaveDue() const;
  absl::Status Save();
  absl::StatusOr<std::map<std::string, Tensor>> CheckpointTensors() const;
  absl::Status PlaceMergeBuffers(int64_t step, const std::map<std::string, std::string>& metadata,
                                 std::map<std::string, Tensor>& tensors) const;
  absl::Status Evaluate(int64_t epoch);
  absl::StatusOr<JobSummary> GatherJobSummary() const;

  const RankPlan& plan_;
  const TrainOptions& options_;
  const Clock::time_point t_begin_;
  // The trainer's own agreements (settings, stops, saves, summaries) run
  // over the world's communicator, between steps.
  Communicator* const world_;
  const bool holds_loss_;
  // This rank holds the loss (the first of its data-parallel group): it
  // writes the metrics and the progress lines.
  const bool reporter_;
  Communicator* dp_ = nullptr;     // the data-parallel group's communicator, if any
  Communicator* relay_ = nullptr;  // the pipeline group's, where fetches cross to the loss's stage
  const bool progress_;
  const std::string acc_fetch_;
  const std::string eval_name_;
  TrainReport report_;
  std::unique_ptr<Tracer> tracer_;
  std::unique_ptr<Executor> executor_;
  int64_t batch_ = 0;  // the global batch
  // The data loader's staging buffers (see StartPrefetcher): counted apart
  // from the rank's own bytes, as a GPU's pinned host buffers are.
  CpuAllocator loader_allocator_;
  std::unique_ptr<Dataset> train_data_;
  std::unique_ptr<Dataset> eval_data_;
  int64_t last_eval_step_ = -1;  // the step the last evaluation followed
  int64_t loaded_epoch_ = 0;     // --eval_only: the epoch of the loaded checkpoint's step
  int64_t steps_per_epoch_ = 0;
  int64_t total_steps_ = 0;
  MetricsWriter metrics_;
  // The step loop's clocks and counters.
  Clock::time_point last_progress_;
  Clock::time_point train_begin_;
  int64_t first_step_ = 0;
  int64_t next_stop_check_ = 0;
  std::string loaded_save_id_;  // the loaded checkpoint's save id (CheckpointSource.save_id)
  std::optional<FeedPrefetcher> prefetcher_;
};

absl::Status TrainSession::CreateExecutor() {
  ExecutorOptions eopts;
  eopts.seed = options_.seed;
  eopts.comms = options_.comms;
  eopts.device = options_.device;
  if (!options_.trace_path.empty()) {
    tracer_ = std::make_unique<Tracer>(plan_.rank());
    eopts.tracer = tracer_.get();
  }
  eopts.comm_timeout_s = options_.comm_timeout_s;
  // On the host, which runs kernels as they are called, the executor
  // captures nothing and its note says so (StepGraphBlocker).
  eopts.cuda_graph = options_.cuda_graph;
  STRATA_ASSIGN_OR_RETURN(executor_, Executor::Create(plan_, eopts));
  STRATA_ASSIGN_OR_RETURN(dp_, DataParallelCommunicator(plan_, options_.comms));
  STRATA_ASSIGN_OR_RETURN(relay_, RelayCommunicator(plan_, options_.comms));
  return absl::OkStatus();
}

absl::Status TrainSession::FixBatchSize() {
  batch_ = PlanBatchSize(plan_);
  if (batch_ <= 0) return absl::InvalidArgumentError("the plan has no batch size");
  report_.batch_size = batch_;
  // --eval_only runs no step: the evaluation's own prediction (a plan from
  // before it existed has 0 there and keeps the step's, an upper bound).
  report_.predicted_peak_bytes = PredictedPeak(plan_.memory(), options_.eval_only);
  return absl::OkStatus();
}

// The ops that read the labels fix how many classes the data may have.
// Pipeline stages hold only their own ops, so the ranks share what they
// found; every rank then opens the same data and fails the label check
// alike, before any step.
absl::Status TrainSession::OpenData() {
  const std::vector<FeedSpec> feeds = FeedSpecs(plan_.program());
  STRATA_ASSIGN_OR_RETURN(const LabelConsumer consumer, AgreedLabelConsumer(feeds));
  STRATA_RETURN_IF_ERROR(OpenJobData(options_, feeds, consumer, &train_data_, &eval_data_));
  if (train_data_) train_data_->set_allocator(&loader_allocator_);
  if (eval_data_) eval_data_->set_allocator(&loader_allocator_);
  return absl::OkStatus();
}

absl::StatusOr<LabelConsumer> TrainSession::AgreedLabelConsumer(const std::vector<FeedSpec>& feeds) const {
  const LabelConsumer consumer = PlanLabelConsumer(plan_.program(), feeds);
  if (world_ == nullptr || world_->size() <= 1) return consumer;
  return ShareLabelConsumer(consumer, *world_, options_.comm_timeout_s);
}

absl::Status TrainSession::CountSteps() {
  // Under gradient merge an epoch holds whole updates, as the single device's
  // epoch of k-times-larger batches does.
  if (options_.eval_only) {
    // No step runs: the run ends where it starts (the loaded step, or 0).
    total_steps_ = 0;
    executor_->set_total_steps(total_steps_);
    return absl::OkStatus();
  }
  const int64_t k = executor_->merge_steps();
  STRATA_ASSIGN_OR_RETURN(steps_per_epoch_, StepsPerEpoch(*train_data_, options_.data, batch_, k));
  if (options_.steps > 0 && options_.steps % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--steps ", options_.steps,
                                                   " is not a multiple of gradient_merge.k_steps ", k,
                                                   ": --steps counts steps, and the optimizer runs once every ", k,
                                                   " of them; use --steps ", (options_.steps / k + 1) * k));
  }
  if (options_.eval_every > 0 && options_.eval_every % k != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--eval_every ", options_.eval_every,
                                                   " is not a multiple of gradient_merge.k_steps ", k,
                                                   ": the weights change once every ", k, " steps; use --eval_every ",
                                                   (options_.eval_every / k + 1) * k));
  }
  report_.steps_per_epoch = steps_per_epoch_;
  const int64_t epochs = std::max<int64_t>(options_.epochs, 1);
  if (options_.steps <= 0 && epochs > std::numeric_limits<int64_t>::max() / steps_per_epoch_) {
    return absl::InvalidArgumentError(
        absl::StrCat("--epochs ", epochs, " x ", steps_per_epoch_, " steps an epoch overflows a 64-bit step count"));
  }
  total_steps_ = options_.steps > 0 ? options_.steps : epochs * steps_per_epoch_;
  executor_->set_total_steps(total_steps_);
  return absl::OkStatus();
}

absl::Status TrainSession::CheckOutputsWritable() const {
  if (!options_.save_dir.empty()) {
    if (auto s = CheckSaveTarget(options_.save_dir, LoadsFromSaveFolder(options_.load_dir, options_.save_dir));
        !s.ok()) {
      return s;
    }
  }
  if (!options_.trace_path.empty()) {
    if (auto s = CheckWritableFile(options_.trace_path, "--trace"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// The initial weights and state, but none of what --load's checkpoint holds
// (drawn for nothing, and held beside the loaded copy while it loads).
absl::Status TrainSession::InitializeState() {
  std::set<std::string> to_load;
  if (!options_.load_dir.empty()) {
    // Headers only; a checkpoint that is not there (a first start) loads nothing.
    if (absl::StatusOr<std::set<std::string>> names = CheckCheckpointFiles(options_.load_dir); names.ok()) {
      to_load = *std::move(names);
    }
  }
  return executor_->InitializeState(to_load);
}

// --load: the checkpoint's state and step, if this run may resume from it.
absl::Status TrainSession::ResumeFromCheckpoint() {
  if (options_.load_dir.empty()) return absl::OkStatus();
  CheckpointSource source;
  // This rank reads its own vars' tensors, and the saved parts of the
  // gradient-merge sums it takes whole (PlaceMergeBuffers), not the whole
  // checkpoint: a stage of a pipeline reads its stage's share.
  std::set<std::string> mine;
  for (const Var& v : plan_.program().var()) mine.insert(v.name());
  for (const Program::MergePart& m : plan_.program().merge_part()) mine.insert(m.whole());
  // The optimizer's update count (one scalar) where this rank's plan has
  // none, for the learning rate it reports.
  const bool takes_update_count = !executor_->counts_updates() && mine.insert("@step").second;
  const TensorFilter wanted = [&mine](const std::string& name, const std::map<std::string, std::string>& metadata) {
    if (mine.count(name)) return true;
    auto part = metadata.find(absl::StrCat(kMergePartKey, name));
    return part != metadata.end() && mine.count(part->second) > 0;
  };
  auto ckpt = LoadCheckpointFrom(options_.load_dir, &source, &wanted);
  if (!ckpt.ok() && absl::IsNotFound(ckpt.status()) && SameFolder(options_.load_dir, options_.save_dir)) {
    // --load DIR --save DIR restarts a preempted job; its first start has nothing to load.
    if (reporter_)
      std::fprintf(stderr, "note: no checkpoint in %s yet; starting at step 0\n", options_.load_dir.c_str());
    return absl::OkStatus();
  }
  if (!ckpt.ok()) {
    return absl::Status(ckpt.status().code(),
                        absl::StrCat("--load ", options_.load_dir, ": ", ckpt.status().message()));
  }
  // An evaluation takes the weights of any checkpoint, whatever batch, seed
  // or steps saved them; a resumed run must continue the saved one.
  auto step = options_.eval_only
                  ? SavedStep(ckpt->metadata)
                  : CheckResumable(ckpt->metadata, batch_, options_.seed, total_steps_, ScheduleSpansRun(plan_.program()));
  if (!step.ok()) {
    return absl::Status(step.status().code(),
                        absl::StrCat("--load ", source.description, ": ", step.status().message()));
  }
  // An evaluation reads the weights alone: a merge's pending gradients (a
  // checkpoint mid-way through an update, of any k_steps) do not matter, so
  // they are placed as at an update's start (step 0 of it).
  if (auto s = PlaceMergeBuffers(options_.eval_only ? 0 : *step, ckpt->metadata, ckpt->tensors); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--load ", source.description, ": ", s.message()));
  }
  // The optimizer's update count (passes/optimizer.h kStepVar) lags the
  // run's step under gradient merge and skipped updates, never leads it.
  if (auto it = ckpt->tensors.find("@step"); it != ckpt->tensors.end() && it->second.num_elements() == 1) {
    const double updates = it->second.ValueAt(0);
    if (!(updates >= 0 && updates <= static_cast<double>(*step))) {
      return absl::InvalidArgumentError(absl::StrCat("--load ", source.description,
                                                     ": '@step' (the optimizer's update count) is ", updates,
                                                     "; a checkpoint of step ", *step, " holds 0 to ", *step));
    }
  }
  std::optional<int64_t> update_count;
  if (auto it = ckpt->tensors.find("@step"); takes_update_count && it != ckpt->tensors.end()) {
    if (it->second.num_elements() == 1) update_count = static_cast<int64_t>(it->second.ValueAt(0));
    ckpt->tensors.erase(it);  // not a var of this rank
  }
  // The tensors just read become the rank's state as they are.
  if (auto s = executor_->LoadPersistentState(std::move(ckpt->tensors), /*weights_only=*/options_.eval_only);
      !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--load ", source.description, ": ", s.message()));
  }
  if (update_count.has_value()) executor_->set_updates_made(*update_count);
  executor_->set_step(*step);
  // The updates the saving run made, under its own merge k: a run resumed at
  // an update's start with another k numbers its updates on from them.
  STRATA_ASSIGN_OR_RETURN(const int64_t saved_k, SavedMergeSteps(ckpt->metadata));
  executor_->set_updates_before(*step / saved_k, *step / saved_k * saved_k);
  if (options_.eval_only) {
    total_steps_ = *step;
    // The epoch the saving run's step fell in, as its evaluation there said:
    // the epochs it completed, plus one where it was part-way into the next.
    auto completed = MetadataInt<int64_t>(ckpt->metadata, "epoch", 0);
    auto position = MetadataInt<int64_t>(ckpt->metadata, "data_position", 0);
    for (const auto* read : {&completed, &position}) {
      if (!read->ok()) {
        return absl::Status(read->status().code(),
                            absl::StrCat("--load ", source.description, ": ", read->status().message()));
      }
    }
    if (completed->has_value()) loaded_epoch_ = **completed + (position->value_or(0) > 0);
  }
  report_.loaded_from = source.description;
  loaded_save_id_ = source.save_id;
  // Said even under --quiet: which checkpoint a run continues is part of its record.
  if (reporter_) {
    std::fprintf(stderr, "%s %s at step %lld\n", options_.eval_only ? "evaluating" : "resuming from",
                 source.description.c_str(), static_cast<long long>(*step));
  }
  return absl::OkStatus();
}

// The folder `latest` names is never rewritten in place: a run resumed from
// an older step into the same folder must not be due to save that step.
absl::Status TrainSession::CheckSaveKeepsLatest() const {
  if (options_.save_dir.empty()) return absl::OkStatus();
  absl::StatusOr<int64_t> latest = LatestStep(options_.save_dir);
  if (!latest.ok()) return latest.status();
  const int64_t from = executor_->step();
  if (*latest > from && (*latest == total_steps_ || (options_.save_every > 0 && *latest % options_.save_every == 0))) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--save ", options_.save_dir, ": its latest checkpoint is step ", *latest, ", which this run (from step ", from,
        ") would save again; resume from ", options_.save_dir, " itself, or save into another folder"));
  }
  return absl::OkStatus();
}

// Every rank writes its share of a checkpoint into --save and rank 0 commits
// the folder once it sees them all, so the folder must be one every rank
// shares: ranks started by hand with folders of their own trained the whole
// run before the first save said so. Each rank puts a file of a random name
// there, the ranks swap the names, each looks for the others', and they
// agree on what was missing, so every rank fails alike before the first step.
absl::Status TrainSession::CheckSaveFolderShared() const {
  if (world_ == nullptr || world_->size() <= 1 || options_.save_dir.empty()) return absl::OkStatus();
  std::random_device entropy;
  const std::string name =
      absl::StrCat(".strata-shared.", absl::Hex((uint64_t{entropy()} << 32) ^ entropy(), absl::kZeroPad16));
  const std::string mine = absl::StrCat(options_.save_dir, "/", name);
  // A rank that cannot write its file still takes part, so the others do
  // not wait for it: its entry says why ("!" and the error).
  std::string entry = name;
  if (!std::ofstream(mine)) entry = absl::StrCat("!", std::strerror(errno));
  const absl::Duration timeout = absl::Seconds(options_.comm_timeout_s);
  absl::StatusOr<std::vector<std::string>> names = AllGatherStrings(*world_, entry, timeout);
  std::string unseen;
  if (names.ok()) {
    for (int r = 0; r < static_cast<int>(names->size()); ++r) {
      const std::string& theirs = (*names)[r];
      if (absl::StartsWith(theirs, "!")) continue;
      if (access(absl::StrCat(options_.save_dir, "/", theirs).c_str(), F_OK) != 0) {
        absl::StrAppend(&unseen, unseen.empty() ? "" : ", ", r);
      }
    }
  }
  absl::StatusOr<std::vector<std::string>> verdicts =
      names.ok() ? AllGatherStrings(*world_, unseen, timeout) : names.status();
  std::remove(mine.c_str());  // every rank has looked
  if (!verdicts.ok()) {
    return absl::Status(verdicts.status().code(),
                        absl::StrCat("checking that --save is shared: ", verdicts.status().message()));
  }
  for (int r = 0; r < static_cast<int>(names->size()); ++r) {
    if (!absl::StartsWith((*names)[r], "!")) continue;
    return absl::FailedPreconditionError(
        absl::StrCat("--save ", options_.save_dir, ": rank ", r, " cannot write there: ", (*names)[r].substr(1)));
  }
  for (int r = 0; r < static_cast<int>(verdicts->size()); ++r) {
    if ((*verdicts)[r].empty()) continue;
    return absl::FailedPreconditionError(absl::StrCat(
        "--save ", options_.save_dir, ": rank ", r, " does not see the files rank(s) ", (*verdicts)[r],
        " wrote there: --save must be a folder every rank shares (one filesystem), since every rank writes its "
        "share of each checkpoint and rank 0 commits the folder"));
  }
  return absl::OkStatus();
}

absl::Status TrainSession::CheckRanksAgreeOnSettings() const {
  if (world_ == nullptr || world_->size() <= 1) return absl::OkStatus();
  const std::vector<std::pair<std::string, std::string>> settings = {
      {"--steps", absl::StrCat(options_.steps)},
      {"--epochs", absl::StrCat(options_.epochs)},
      {"--seed", absl::StrCat(options_.seed)},
      {"--data", train_data_ ? train_data_->identity() : "(none)"},
      {"--eval_data", eval_data_ ? eval_data_->identity() : "(none)"},
      {"the global batch", absl::StrCat(batch_)},
      // Its step, and which save it is: ranks started by hand can name
      // different runs' folders of one step (each rank loading its own
      // run's weights trained a mixed model, exit 0).
      {"the loaded checkpoint", report_.loaded_from.empty()
                                    ? "(none)"
                                    : absl::StrCat("step ", executor_->step(),
                                                   loaded_save_id_.empty()
                                                       ? " (saved without a save id)"
                                                       : absl::StrCat(" (save ", loaded_save_id_, ")"))},
      {"--comm_timeout_s", absl::StrCat(options_.comm_timeout_s)},
      {"--save_every", absl::StrCat(options_.save_dir.empty() ? 0 : options_.save_every)},
      // An evaluation is collective (a pipelined forward, the replicas' sums).
      {"--eval_every", absl::StrCat(eval_data_ ? options_.eval_every : 0)},
      {"--eval_only", options_.eval_only ? "true" : "false"},
      // Every rank saves its share, or none does (the save is collective);
      // the paths may differ between machines that mount one filesystem.
      {"--save", options_.save_dir.empty() ? "(none)" : "(a folder)"},
      // Whether a step is captured is decided by a vote of every rank
      // (Executor::AgreeOnGraphs), which a rank without graphs never joins.
      {"--cuda_graph", options_.cuda_graph ? "true" : "false"},
  };
  return AgreeOnSettings(*world_, settings, options_.comm_timeout_s);
}

absl::Status TrainSession::OpenMetrics() {
  if (!reporter_) return absl::OkStatus();
  return metrics_.Open(options_.metrics_path, !options_.load_dir.empty());
}

absl::Status TrainSession::RunSteps() {
  last_progress_ = Clock::now();
  train_begin_ = Clock::now();
  first_step_ = executor_->step();
  next_stop_check_ = first_step_ + 1;
  StartPrefetcher();
  bool saved = false;  // the last step ended with a periodic save
  while (executor_->step() < total_steps_) {
    const int64_t step = executor_->step();
    if (double seconds = 10; FaultRequested("slow_step", plan_.rank(), step + 1, &seconds)) {
      absl::SleepFor(absl::Seconds(seconds));  // a slow but live rank (its heartbeat goes on)
    }
    const int64_t epoch = step / steps_per_epoch_;
    const auto t0 = Clock::now();
    STRATA_ASSIGN_OR_RETURN(const StepResult r, RunStep(step));
    STRATA_RETURN_IF_ERROR(RecordStep(step, Seconds(t0, Clock::now()), r));
    ReportProgress(epoch, r);
    const bool epoch_end = executor_->step() % steps_per_epoch_ == 0;
    const bool eval_due = options_.eval_every > 0 && executor_->step() % options_.eval_every == 0;
    const bool evaluate = eval_due || (epoch_end && options_.steps == 0);
    if (evaluate) STRATA_RETURN_IF_ERROR(Evaluate(epoch + 1));
    // A stop request on any rank stops every rank after the same step; after
    // an evaluation or a periodic save (the same step on every rank) the
    // ranks check at once, as the steps counted ahead to the next check did
    // not count their time.
    STRATA_ASSIGN_OR_RETURN(const bool stop, StopAgreed(/*now=*/(evaluate && eval_data_ != nullptr) || saved));
    if (stop) break;
    saved = PeriodicSaveDue();
    if (saved) STRATA_RETURN_IF_ERROR(Save());
  }
  return absl::OkStatus();
}

// The samples of a micro-batch depend only on (seed, epoch, position): the
// loader reads them one micro-batch ahead, on its own thread, into its own
// allocator; a micro-batch's forward copies them into this rank's, where
// the memory plan counts them.
void TrainSession::StartPrefetcher() {
  prefetcher_.emplace([this, order_epoch = int64_t{-1}, order = std::vector<int64_t>()](
                          const FeedPrefetcher::Key& key) mutable -> absl::StatusOr<FeedPrefetcher::Feeds> {
    const int64_t epoch = key.step / steps_per_epoch_;
    if (epoch != order_epoch) {
      order = EpochOrder(train_data_->size(), options_.seed, epoch);
      order_epoch = epoch;
    }
    const int64_t position = (key.step % steps_per_epoch_) * batch_ + key.first;
    auto feeds = LoadBatch(*train_data_, absl::MakeConstSpan(order).subspan(position, key.rows));
    if (feeds.ok()) DropUnreadFeeds(*executor_, &*feeds);
    return feeds;
  });
}

// Rows [first, first + rows) of the step's global batch, in this rank's
// memory (a GPU plan's feeds in host memory: its copy_to_device ops copy
// them in); the prefetcher starts loading this rank's micro-batch after them
// (of the next step after the last).
absl::StatusOr<std::map<std::string, Tensor>> TrainSession::MicroBatchFeeds(int64_t step, int64_t first, int64_t rows) {
  // This rank's next micro-batch: one global micro-batch on.
  std::optional<FeedPrefetcher::Key> next;
  const int64_t stride = rows * std::max(1, plan_.topology().dp_degree());
  if (first + stride < batch_) {
    next = FeedPrefetcher::Key{step, first + stride, rows};
  } else if (step + 1 < total_steps_) {
    next = FeedPrefetcher::Key{step + 1, executor_->SampleRow(0, rows), rows};
  }
  auto feeds = prefetcher_->Get({step, first, rows}, next);
  if (!feeds.ok()) return feeds.status();
  STRATA_RETURN_IF_ERROR(IntoRankMemory(*executor_, options_.device, &*feeds));
  return feeds;
}

// One optimizer step, with this rank's peak bytes measured over it; a step
// that fails or whose loss is not finite ends the run.
absl::StatusOr<StepResult> TrainSession::RunStep(int64_t step) {
  options_.device->allocator()->ResetPeak();
  auto r = executor_->TrainStep(
      [this, step](int64_t first, int64_t rows) -> absl::StatusOr<std::map<std::string, Tensor>> {
        return MicroBatchFeeds(step, first, rows);
      },
      0);
  NoteMeasuredPeak();
  if (executor_->graph_note() != report_.cuda_graph_note) {
    report_.cuda_graph_note = executor_->graph_note();
    if (reporter_) std::fprintf(stderr, "note: --cuda_graph: %s\n", report_.cuda_graph_note.c_str());
  }
  report_.cuda_graphs = executor_->graphs();
  for (std::string& line : options_.device->KernelFallbacks(report_.kernel_fallbacks.size())) {
    if (reporter_) std::fprintf(stderr, "note: %s\n", line.c_str());
    report_.kernel_fallbacks.push_back(std::move(line));
  }
  if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat("step ", step + 1, ": ", r.status().message()));
  if (relay_ != nullptr) {
    // The fetches made off the loss's stage: their stage's values, summed
    // over the pipeline group (every other stage adds 0), reach the loss's.
    std::vector<double> values;
    for (const RankPlan::RelayedFetch& f : plan_.relayed_fetch()) {
      auto it = r->fetches.find(f.name());
      values.push_back(f.stage() == plan_.topology().stage() && it != r->fetches.end() ? it->second : 0.0);
    }
    STRATA_RETURN_IF_ERROR(SumOverGroup(relay_, values, options_.comm_timeout_s,
                                        absl::StrCat("step ", step + 1, "'s fetches over the pipeline group")));
    if (holds_loss_) {
      for (int k = 0; k < plan_.relayed_fetch_size(); ++k) r->fetches[plan_.relayed_fetch(k).name()] = values[k];
    }
  }
  if (holds_loss_ && dp_ != nullptr) {
    // Each replica's loss and fetches are means over its equal share of the
    // global batch: their mean over the group is the global batch's. A loss
    // or fetch that is a sum over samples is the replicas' sum.
    std::vector<double> values = {r->loss};
    for (const auto& [name, v] : r->fetches) values.push_back(v);
    STRATA_RETURN_IF_ERROR(SumOverGroup(dp_, values, options_.comm_timeout_s,
                                        absl::StrCat("step ", step + 1, "'s loss over the data-parallel group")));
    r->loss = plan_.summed_loss() ? values[0] : values[0] / dp_->size();
    size_t k = 1;
    for (auto& [name, v] : r->fetches) {
      v = values[k++];
      if (!IsSummedFetch(plan_, name)) v /= dp_->size();
    }
  }
  // A back-off stops at float32's least normal scale (kernels/
  // loss_scaling_math.h): a step that overflows even there (its scale is the
  // one it ran with) has gradients that are not finite at any scale, and
  // would skip every update to the end of the run.
  if (r->has_loss_scale && r->skipped_update && r->loss_scale <= std::numeric_limits<float>::min()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step + 1,
        ": the gradients are not finite even at the least loss scale (2^-126): training "
        "diverged (lower the learning rate?), or an op's gradient is infinite where it is taken (sqrt or log "
        "at 0)"));
  }
  if (r->has_loss && !std::isfinite(r->loss)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step + 1, ": loss is ", r->loss, "; training diverged (lower the learning rate?)"));
  }
  return r;
}

// The step's --metrics line and its entry in the report.
absl::Status TrainSession::RecordStep(int64_t step, double seconds, const StepResult& r) {
  StepMetrics m;
  m.step = step + 1;
  m.epoch = step / steps_per_epoch_ + 1;  // counted from 1, as the progress lines do
  m.loss = r.loss;
  m.fetches = r.fetches;
  m.step_ms = seconds * 1e3;
  m.samples_per_sec = batch_ / std::max(seconds, 1e-9);
  if (executor_->merge_steps() > 1) m.optimizer_step = r.optimizer_step;
  m.has_loss_scale = r.has_loss_scale;
  m.loss_scale = r.loss_scale;
  m.skipped_update = r.skipped_update;
  m.has_lr = r.has_lr;
  m.lr = r.lr;
  m.has_grad_norm = r.has_grad_norm;
  m.grad_norm = r.grad_norm;
  absl::Status written = metrics_.Line(StepMetricsJson(m));
  report_.steps.push_back(std::move(m));
  return written;
}

// A progress line about once a second, and after the last step.
void TrainSession::ReportProgress(int64_t epoch, const StepResult& r) {
  const auto now = Clock::now();
  if (!progress_ || !(Seconds(last_progress_, now) >= 1.0 || executor_->step() == total_steps_)) return;
  last_progress_ = now;
  const double elapsed = Seconds(train_begin_, now);
  const int64_t done = executor_->step() - first_step_;
  const double rate = done * batch_ / std::max(elapsed, 1e-9);
  const double eta = (total_steps_ - executor_->step()) * elapsed / std::max<int64_t>(done, 1);
  std::string fetches;
  for (const auto& [k, v] : r.fetches) absl::StrAppend(&fetches, " ", k, " ", absl::StrFormat("%.4f", v));
  const std::string lr = r.has_lr ? absl::StrFormat(" lr %.3g", r.lr) : "";
  // Not finite on an update loss scaling skips (the metrics line says null).
  const std::string norm =
      r.has_grad_norm && std::isfinite(r.grad_norm) ? absl::StrFormat(" grad_norm %.3g", r.grad_norm) : "";
  std::fprintf(stderr, "step %lld/%lld epoch %lld loss %.4f%s%s%s %.0f samples/s ETA %s\n",
               static_cast<long long>(executor_->step()), static_cast<long long>(total_steps_),
               static_cast<long long>(epoch + 1), r.loss, fetches.c_str(), lr.c_str(), norm.c_str(), rate,
               FormatDuration(eta).c_str());
}

// Whether a stop signal on any rank stops the run after this step. The ranks
// agree only at the steps they chose last time, about
// kStopCheckPeriodSeconds apart.
absl::StatusOr<bool> TrainSession::StopAgreed(bool now) {
  if (!options_.stop_signal || executor_->step() >= total_steps_ || (!now && executor_->step() < next_stop_check_)) {
    return false;
  }
  const double step_seconds = Seconds(train_begin_, Clock::now()) / (executor_->step() - first_step_);
  const int64_t ahead = static_cast<int64_t>(kStopCheckPeriodSeconds / std::max(step_seconds, 1e-9));
  auto check = AgreeOnStop(options_.stop_signal(), executor_->step() + std::clamp<int64_t>(ahead, 1, 1 << 20), world_,
                           options_.comm_timeout_s);
  if (!check.ok()) return check.status();
  if (check->signal != 0) {
    report_.stop_signal = check->signal;
    return true;
  }
  next_stop_check_ = check->next_check;
  return false;
}

bool TrainSession::PeriodicSaveDue() const {
  return !options_.save_dir.empty() && options_.save_every > 0 && executor_->step() % options_.save_every == 0 &&
         executor_->step() < total_steps_;
}

// What this rank saves. One writer per parameter: data-parallel replicas
// hold the same parameters and optimizer state, so the first of each group
// writes them and the others only metadata. Gradient-merge buffers differ
// between replicas (each sums its own samples): the group's sum is saved, so
// a load under any degree can give it to one replica and zeros to the rest.
absl::StatusOr<std::map<std::string, Tensor>> TrainSession::CheckpointTensors() const {
  const bool writer = plan_.topology().dp_rank() == 0;
  const bool sums = plan_.program().merge_buffer_size() > 0 && dp_ != nullptr;
  using TensorMap = std::map<std::string, Tensor>;
  if (!writer && !sums) return TensorMap();
  STRATA_ASSIGN_OR_RETURN(TensorMap state, executor_->HostState());
  if (!sums) return state;
  TensorMap tensors;
  if (writer) tensors = state;
  for (const std::string& name : plan_.program().merge_buffer()) {
    auto it = state.find(name);
    if (it == state.end()) return absl::InternalError(absl::StrCat("gradient-merge buffer '", name, "' is not state"));
    Tensor sum = it->second.Clone(GetCpuAllocator());  // the live buffer keeps this replica's own part
    if (!sum.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory copying '", name, "'"));
    if (auto s = dp_->AllReduce(&sum, ReduceOp::kSum)->Wait(absl::Seconds(options_.comm_timeout_s)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("summing '", name, "' over the data-parallel group: ", s.message()));
    }
    if (writer) tensors[name] = std::move(sum);
  }
  return tensors;
}

namespace {

// a += b, for the gradients' float types.
absl::Status AddHostTensor(const std::string& name, Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) {
    return absl::DataLossError(absl::StrCat("the parts of gradient-merge buffer '", name, "' differ in type or shape"));
  }
  const int64_t n = a.num_elements();
  if (a.dtype() == F32) {
    for (int64_t i = 0; i < n; ++i) a.data<float>()[i] += b.data<float>()[i];
  } else if (a.dtype() == F64) {
    for (int64_t i = 0; i < n; ++i) a.data<double>()[i] += b.data<double>()[i];
  } else {
    return absl::UnimplementedError(absl::StrCat("gradient-merge buffer '", name, "' is ", DataTypeName(a.dtype()),
                                                 "; its parts add in F32 or F64 only"));
  }
  return absl::OkStatus();
}

}  // namespace

// Gradient-merge buffers as this rank starts from a checkpoint at `step`:
// the first replica of each group takes the saved sum and the others zeros
// (their sum is the same). A checkpoint saved mid-way through an update
// resumes only with the same k_steps; one without the buffers (saved without
// gradient merge) only at the start of an update. A tied weight's gradient
// may be saved whole (one device, or a layout where one stage sums it) or
// as its stages' parts (metadata kMergePartKey): its whole is the sum of
// what was saved, and here it goes to this layout's whole buffer or, where
// this layout sums it from parts, to the primary part (the others zeros).
absl::Status TrainSession::PlaceMergeBuffers(int64_t step, const std::map<std::string, std::string>& metadata,
                                             std::map<std::string, Tensor>& tensors) const {
  STRATA_ASSIGN_OR_RETURN(const int64_t saved_k, SavedMergeSteps(metadata));
  const int64_t k = executor_->merge_steps();
  if (step % saved_k != 0 && saved_k != k) {
    return absl::FailedPreconditionError(absl::StrCat(
        "saved at step ", step, ", mid-way through an update of gradient_merge.k_steps ", saved_k,
        "; resume with the same k_steps (this run has ", k, ") or from a checkpoint at a multiple of ", saved_k));
  }
  std::map<std::string, std::vector<std::string>> saved_parts;  // whole -> the saved buffers of its parts
  for (const auto& [key, whole] : metadata) {
    if (absl::StartsWith(key, kMergePartKey)) saved_parts[whole].push_back(key.substr(sizeof(kMergePartKey) - 1));
  }
  // The whole sums this rank takes, read before any buffer here is replaced
  // (a saved part may share a name with one of this layout's).
  std::map<std::string, std::string> takes;  // this rank's buffer -> the whole it takes; "" for zeros
  for (const std::string& name : plan_.program().merge_buffer()) takes[name] = name;
  for (const Program::MergePart& m : plan_.program().merge_part()) takes[m.buffer()] = m.primary() ? m.whole() : "";
  std::set<std::string> found;  // the wholes the checkpoint holds, whole or in parts
  for (const auto& taken : takes) {
    if (tensors.count(taken.second) || saved_parts.count(taken.second)) found.insert(taken.second);
  }
  // Only the first replica of each data-parallel group takes them.
  std::map<std::string, Tensor> wholes;
  for (const auto& taken : takes) {
    const std::string& whole = taken.second;
    if (plan_.topology().dp_rank() != 0 || !found.count(whole) || wholes.count(whole)) continue;
    auto parts = saved_parts.find(whole);
    auto saved = tensors.find(whole);
    if (parts == saved_parts.end()) {
      if (saved != tensors.end()) wholes[whole] = saved->second;
      continue;
    }
    // What was saved of it: the whole (an older layout's), then its parts.
    std::vector<const Tensor*> pieces;
    if (saved != tensors.end()) pieces.push_back(&saved->second);
    for (const std::string& part : parts->second) {
      auto it = tensors.find(part);
      if (it == tensors.end()) {
        return absl::DataLossError(
            absl::StrCat("has no tensor '", part, "', a part of gradient-merge buffer '", whole, "'"));
      }
      pieces.push_back(&it->second);
    }
    Tensor sum = pieces[0]->Clone(GetCpuAllocator());
    if (!sum.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for '", whole, "'"));
    for (size_t i = 1; i < pieces.size(); ++i) STRATA_RETURN_IF_ERROR(AddHostTensor(whole, sum, *pieces[i]));
    wholes[whole] = std::move(sum);
  }
  for (const auto& [name, whole] : takes) {
    if (!whole.empty() && !found.count(whole) && step % k != 0) {
      return absl::FailedPreconditionError(absl::StrCat("has no gradient-merge buffer '", whole, "', but step ", step,
                                                        " is mid-way through an update of k_steps ", k));
    }
    if (auto it = wholes.find(whole); it != wholes.end()) {
      tensors[name] = it->second;
      continue;
    }
    const Var* var = nullptr;
    for (const Var& v : plan_.program().var()) {
      if (v.name() == name) var = &v;
    }
    if (var == nullptr) return absl::InternalError(absl::StrCat("gradient-merge buffer '", name, "' is not declared"));
    Tensor zeros = Tensor::Zeros(var->dtype(), Shape(var->shape().begin(), var->shape().end()));
    if (!zeros.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for '", name, "'"));
    tensors[name] = std::move(zeros);
  }
  return absl::OkStatus();
}

// Every rank writes its share of a step folder, and they agree that all did.
absl::Status TrainSession::Save() {
  Checkpoint ckpt;
  STRATA_ASSIGN_OR_RETURN(ckpt.tensors, CheckpointTensors());
  ckpt.metadata["epoch"] = absl::StrCat(executor_->step() / steps_per_epoch_);
  ckpt.metadata["data_position"] = absl::StrCat((executor_->step() % steps_per_epoch_) * batch_);
  ckpt.metadata["batch_size"] = absl::StrCat(batch_);
  ckpt.metadata["seed"] = absl::StrCat(options_.seed);
  ckpt.metadata["program"] = plan_.program().name();
  ckpt.metadata["merge_steps"] = absl::StrCat(executor_->merge_steps());
  ckpt.metadata["total_steps"] = absl::StrCat(total_steps_);
  for (const Program::MergePart& m : plan_.program().merge_part()) {
    ckpt.metadata[absl::StrCat(kMergePartKey, m.buffer())] = m.whole();
  }
  SaveStepOptions save_options;
  save_options.dir = options_.save_dir;
  save_options.step = executor_->step();
  save_options.rank = plan_.rank();
  save_options.world_size = std::max(1, plan_.topology().world_size());
  save_options.keep = options_.keep_checkpoints;
  if (world_ != nullptr && world_->size() > 1) {
    save_options.agree = [this](const absl::Status& mine) {
      return AgreeAllRanks(*world_, mine, options_.comm_timeout_s, "saving the checkpoint");
    };
  }
  if (auto s = SaveCheckpointStep(save_options, std::move(ckpt)); !s.ok()) return s;
  report_.last_saved = absl::StrCat(options_.save_dir, "/step-", executor_->step());
  return absl::OkStatus();
}

// With --eval_data: its metrics after `epoch`, reported by the rank with the loss.
absl::Status TrainSession::Evaluate(int64_t epoch) {
  if (!eval_data_) return absl::OkStatus();
  // The memory rule counts an evaluation's bytes too.
  options_.device->allocator()->ResetPeak();
  auto m = RunEvaluation(*executor_, options_.device, *eval_data_, eval_name_, options_.eval_batch_size, acc_fetch_,
                         dp_, relay_, options_.comm_timeout_s);
  NoteMeasuredPeak();
  if (!m.ok()) return m.status();
  m->epoch = epoch;
  m->step = executor_->step();
  last_eval_step_ = m->step;
  if (!reporter_) return absl::OkStatus();
  STRATA_RETURN_IF_ERROR(metrics_.Line(EvalMetricsJson(*m, executor_->step())));
  if (progress_) {
    std::fprintf(stderr, "eval %s at step %lld (epoch %lld): loss %.4f%s\n", eval_name_.c_str(),
                 static_cast<long long>(executor_->step()), static_cast<long long>(epoch), m->loss,
                 m->accuracy >= 0 ? absl::StrFormat(", accuracy %.4f", m->accuracy).c_str() : "");
  }
  report_.evals.push_back(*m);
  return absl::OkStatus();
}

// A --steps run evaluates after its last step, unless a stop cut it short or
// --eval_every evaluated that step already; --eval_only evaluates where it
// loaded (epoch 0: before any training).
absl::Status TrainSession::EvaluateAtEnd() {
  if (options_.eval_only) return Evaluate(loaded_epoch_);
  if (options_.steps > 0 && executor_->step() > first_step_ && report_.stop_signal == 0 &&
      last_eval_step_ != executor_->step()) {
    // Epochs count from 1: the one the last step fell in.
    if (auto s = Evaluate((executor_->step() - 1) / steps_per_epoch_ + 1); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TrainSession::SaveAtEnd() {
  if (!options_.eval_only && !options_.save_dir.empty() && executor_->step() > first_step_) {
    if (auto s = Save(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status TrainSession::RecordFinalState() {
  if (!options_.record_final_state) return absl::OkStatus();
  STRATA_ASSIGN_OR_RETURN(const auto final_state, executor_->HostState());
  for (const auto& [name, t] : final_state) {
    std::vector<double>& out = report_.final_state[name];
    out.resize(t.num_elements());
    for (int64_t i = 0; i < t.num_elements(); ++i) out[i] = t.ValueAt(i);
  }
  return absl::OkStatus();
}

absl::Status TrainSession::WriteTrace() const {
  if (tracer_) {
    if (auto s = tracer_->Write(options_.trace_path); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Every rank's peak and busy/idle time, gathered for the summary line.
absl::StatusOr<TrainSession::JobSummary> TrainSession::GatherJobSummary() const {
  JobSummary job;
  job.peak_measured = report_.measured_peak_bytes;
  job.peak_predicted = report_.predicted_peak_bytes;
  job.peak_reserved = report_.peak_reserved_bytes;
  if (world_ == nullptr || world_->size() <= 1) return job;
  constexpr int kFields = 6;
  Tensor mine = Tensor::Empty(F64, {kFields});
  Tensor all = Tensor::Empty(F64, {static_cast<int64_t>(world_->size()) * kFields});
  if (!mine.defined() || !all.defined()) return absl::ResourceExhaustedError("out of memory gathering the summaries");
  double* m = mine.data<double>();
  m[0] = plan_.rank();
  m[1] = static_cast<double>(report_.measured_peak_bytes);
  m[2] = static_cast<double>(report_.predicted_peak_bytes);
  m[3] = executor_->busy_seconds();
  m[4] = executor_->wait_seconds();
  m[5] = static_cast<double>(report_.peak_reserved_bytes);
  if (auto s = world_->AllGather(mine, &all)->Wait(absl::Seconds(options_.comm_timeout_s)); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("gathering the ranks' summaries: ", s.message()));
  }
  for (int r = 0; r < world_->size(); ++r) {
    const double* v = all.data<double>() + kFields * r;
    nlohmann::ordered_json rank = {{"rank", static_cast<int>(v[0])},
                                   {"measured_peak_bytes", static_cast<int64_t>(v[1])},
                                   {"predicted_peak_bytes", static_cast<int64_t>(v[2])}};
    if (v[5] >= 0) rank["peak_reserved_bytes"] = static_cast<int64_t>(v[5]);
    rank["busy_s"] = Metric(v[3]);
    rank["idle_s"] = Metric(v[4]);
    job.ranks.push_back(std::move(rank));
    if (r == 0 || static_cast<int64_t>(v[1]) > job.peak_measured) {
      // The job's peak: the rank that measured the most, with its prediction and reserved bytes.
      job.peak_measured = static_cast<int64_t>(v[1]);
      job.peak_predicted = static_cast<int64_t>(v[2]);
      job.peak_reserved = static_cast<int64_t>(v[5]);
    }
  }
  return job;
}

absl::Status TrainSession::WriteSummary() {
  STRATA_ASSIGN_OR_RETURN(JobSummary job, GatherJobSummary());
  if (reporter_) {
    nlohmann::ordered_json summary = {{"steps", executor_->step()},
                                      {"seconds", Metric(report_.seconds)},
                                      {"measured_peak_bytes", job.peak_measured},
                                      {"predicted_peak_bytes", job.peak_predicted}};
    if (job.peak_reserved >= 0) summary["peak_reserved_bytes"] = job.peak_reserved;
    if (!job.ranks.empty()) summary["ranks"] = std::move(job.ranks);
    // Appended to a run's own metrics (--load appends), an evaluation's
    // summary is told apart from the training's.
    if (options_.eval_only) summary["eval_only"] = true;
    STRATA_RETURN_IF_ERROR(metrics_.Line(JsonLine({{"summary", std::move(summary)}})));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckJobData(const std::vector<RankPlan>& plans, const TrainOptions& options) {
  if (plans.empty()) return absl::OkStatus();
  const std::vector<FeedSpec> feeds = FeedSpecs(plans[0].program());
  std::vector<LabelConsumer> ranks;
  for (const RankPlan& plan : plans) ranks.push_back(PlanLabelConsumer(plan.program(), FeedSpecs(plan.program())));
  std::unique_ptr<Dataset> train, eval;
  STRATA_RETURN_IF_ERROR(OpenJobData(options, feeds, TightestLabelConsumer(ranks), &train, &eval));
  if (!train) return absl::OkStatus();  // --eval_only
  const int64_t k = std::max(1, plans[0].schedule().merge_steps());
  return StepsPerEpoch(*train, options.data, PlanBatchSize(plans[0]), k).status();
}

absl::StatusOr<TrainReport> Train(const RankPlan& plan, const TrainOptions& options) {
  TrainSession session(plan, options);
  STRATA_RETURN_IF_ERROR(session.CreateExecutor());
  STRATA_RETURN_IF_ERROR(session.FixBatchSize());
  STRATA_RETURN_IF_ERROR(session.OpenData());
  STRATA_RETURN_IF_ERROR(session.CountSteps());
  STRATA_RETURN_IF_ERROR(session.CheckOutputsWritable());
  STRATA_RETURN_IF_ERROR(session.InitializeState());
  STRATA_RETURN_IF_ERROR(session.ResumeFromCheckpoint());
  STRATA_RETURN_IF_ERROR(session.CheckSaveKeepsLatest());
  STRATA_RETURN_IF_ERROR(session.CheckRanksAgreeOnSettings());
  STRATA_RETURN_IF_ERROR(session.CheckSaveFolderShared());
  STRATA_RETURN_IF_ERROR(session.OpenMetrics());
  // Once nothing before the first step can fail, so an error is the run's only line.
  for (const std::string& note : options.notes) std::fprintf(stderr, "note: %s\n", note.c_str());

  if (!options.eval_only) STRATA_RETURN_IF_ERROR(session.RunSteps());

  STRATA_RETURN_IF_ERROR(session.EvaluateAtEnd());
  STRATA_RETURN_IF_ERROR(session.SaveAtEnd());
  STRATA_RETURN_IF_ERROR(session.RecordFinalState());
  STRATA_RETURN_IF_ERROR(session.WriteTrace());
  session.StopClock();
  STRATA_RETURN_IF_ERROR(session.WriteSummary());
  return session.TakeReport();
}

}  // namespace strata
