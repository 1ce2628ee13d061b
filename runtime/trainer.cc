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

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "proto/status_macros.h"
#include "runtime/checkpoint.h"
#include "runtime/dataset.h"
#include "runtime/comm/communicator.h"
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
    out_.open(path, append ? std::ios::app : std::ios::trunc);
    if (!out_) return absl::PermissionDeniedError(absl::StrCat(path, ": cannot open --metrics file for writing"));
    return absl::OkStatus();
  }
  void Line(const std::string& json) {
    if (!out_.is_open()) return;
    out_ << json << "\n";
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// Every rank opens the data with all the program's feeds, so all ranks see
// the same samples in the same order; each binds the ones it reads.
std::vector<FeedSpec> FeedSpecs(const Program& program) {
  std::vector<FeedSpec> specs;
  for (const Var& v : program.var()) {
    if (v.kind() == FEED) specs.push_back({v.name(), v.dtype(), std::vector<int64_t>(v.shape().begin(), v.shape().end())});
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

absl::StatusOr<std::map<std::string, Tensor>> LoadBatch(const Dataset& data, absl::Span<const int64_t> indices) {
  std::vector<Tensor> tensors;
  if (auto s = data.GetBatch(indices, &tensors); !s.ok()) return s;
  std::map<std::string, Tensor> feeds;
  for (size_t i = 0; i < data.feeds().size(); ++i) feeds[data.feeds()[i].name] = std::move(tensors[i]);
  return feeds;
}

// The fetch var an `accuracy` op produces, if the program reports one.
std::string AccuracyFetch(const Program& program) {
  for (const auto& f : program.fetch()) {
    for (const Op& op : program.op()) {
      if (op.type() == "accuracy" && op.output_size() > 0 && op.output(0) == f) return f;
    }
  }
  return "";
}

absl::StatusOr<EvalMetrics> RunEvaluation(Executor& executor, const Dataset& data, const std::string& name,
                                          int64_t batch, const std::string& acc_fetch) {
  EvalMetrics m;
  m.name = name;
  double loss_sum = 0, acc_sum = 0;
  int64_t seen = 0;
  std::vector<int64_t> indices;
  for (int64_t begin = 0; begin < data.size(); begin += batch) {
    int64_t n = std::min(batch, data.size() - begin);
    indices.resize(n);
    for (int64_t i = 0; i < n; ++i) indices[i] = begin + i;
    auto feeds = LoadBatch(data, indices);
    if (!feeds.ok()) return feeds.status();
    DropUnreadFeeds(executor, &*feeds);
    auto r = executor.Evaluate(*feeds, 0, n);
    if (!r.ok()) return r.status();
    loss_sum += r->loss * n;
    if (!acc_fetch.empty()) acc_sum += r->fetches[acc_fetch] * n;
    seen += n;
  }
  m.loss = loss_sum / std::max<int64_t>(seen, 1);
  m.accuracy = acc_fetch.empty() ? -1 : acc_sum / std::max<int64_t>(seen, 1);
  return m;
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
  LabelConsumer tightest;
  for (int r = 0; r < comm.size(); ++r) {
    const int64_t* words = all.data<int64_t>() + r * kWords;
    if (words[0] <= 0 || (tightest.classes > 0 && words[0] >= tightest.classes)) continue;
    const char* bytes = reinterpret_cast<const char*>(words + 1);
    tightest.classes = words[0];
    tightest.what = std::string(bytes, strnlen(bytes, kTextBytes));
  }
  return tightest;
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

// Ranks started by hand can be given different settings; training on them
// would hang (different step counts) or silently train the wrong model
// (different seeds or data). Every rank sends its settings to every other and
// all refuse, naming the first one that differs from rank 0's.
absl::Status AgreeOnSettings(Communicator& comm, const std::vector<std::pair<std::string, std::string>>& settings,
                             double timeout_s) {
  std::string mine;
  for (const auto& [name, value] : settings) absl::StrAppend(&mine, name, "=", absl::StrReplaceAll(value, {{"\n", " "}}), "\n");
  Tensor length = Tensor::Empty(I64, {1});
  Tensor lengths = Tensor::Empty(I64, {comm.size()});
  if (!length.defined() || !lengths.defined()) return absl::ResourceExhaustedError("out of memory comparing settings");
  length.data<int64_t>()[0] = static_cast<int64_t>(mine.size());
  const absl::Duration timeout = absl::Seconds(timeout_s);
  if (auto s = comm.AllGather(length, &lengths)->Wait(timeout); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("comparing the ranks' settings: ", s.message()));
  }
  int64_t words = 1;
  for (int r = 0; r < comm.size(); ++r) words = std::max(words, (lengths.data<int64_t>()[r] + 7) / 8);
  Tensor text = Tensor::Zeros(I64, {words});
  Tensor all = Tensor::Empty(I64, {comm.size() * words});
  if (!text.defined() || !all.defined()) return absl::ResourceExhaustedError("out of memory comparing settings");
  std::memcpy(text.raw_data(), mine.data(), mine.size());
  if (auto s = comm.AllGather(text, &all)->Wait(timeout); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("comparing the ranks' settings: ", s.message()));
  }
  auto settings_of = [&](int r) {
    const char* bytes = reinterpret_cast<const char*>(all.data<int64_t>() + r * words);
    std::vector<std::pair<std::string, std::string>> out;
    for (absl::string_view line : absl::StrSplit(absl::string_view(bytes, lengths.data<int64_t>()[r]), '\n',
                                                 absl::SkipEmpty())) {
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

// The checkpoint's step, if this run may resume from it: the same batch and
// seed (both decide the data order and dropout masks), and steps left to run.
absl::StatusOr<int64_t> CheckResumable(const std::map<std::string, std::string>& metadata, int64_t batch,
                                       uint64_t seed, int64_t total_steps) {
  int64_t step = 0;
  auto it = metadata.find("step");
  if (it == metadata.end() || !absl::SimpleAtoi(it->second, &step) || step < 0) {
    return absl::InvalidArgumentError("checkpoint has no valid 'step'");
  }
  auto bs = metadata.find("batch_size");
  int64_t saved_batch = 0;
  if (bs != metadata.end() && absl::SimpleAtoi(bs->second, &saved_batch) && saved_batch != batch) {
    return absl::InvalidArgumentError(absl::StrCat("saved with batch size ", saved_batch, ", resuming with ", batch,
                                                   " would change the data order"));
  }
  auto sd = metadata.find("seed");
  uint64_t saved_seed = 0;
  if (sd != metadata.end() && absl::SimpleAtoi(sd->second, &saved_seed) && saved_seed != seed) {
    return absl::InvalidArgumentError(absl::StrCat("saved with seed ", saved_seed, ", resuming with ", seed,
                                                   " would change the data order and dropout masks"));
  }
  if (step >= total_steps) {
    return absl::OutOfRangeError(absl::StrCat("the checkpoint is at step ", step, " but the run ends at step ",
                                              total_steps, "; nothing left to train (--steps counts the whole run)"));
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
    // A fetch named like one of the line's own keys (a fetched "loss") would
    // repeat that key, which JSON readers resolve differently: the line's own wins.
    if (!line.contains(name) && name != "samples_per_sec" && name != "step_ms") line[name] = Metric(value);
  }
  line["samples_per_sec"] = Metric(m.samples_per_sec);
  line["step_ms"] = Metric(m.step_ms);
  return JsonLine(line);
}

std::string EvalMetricsJson(const EvalMetrics& m, int64_t step) {
  nlohmann::ordered_json line = {{"eval", m.name}, {"step", step}, {"epoch", m.epoch}, {"loss", Metric(m.loss)}};
  if (m.accuracy >= 0) line["accuracy"] = Metric(m.accuracy);
  return JsonLine(line);
}

absl::StatusOr<TrainReport> Train(const RankPlan& plan, const TrainOptions& options) {
  TrainReport report;
  const auto t_begin = Clock::now();
  // The trainer's own agreements (settings, stops, saves, summaries) run
  // over the world's communicator, between steps.
  Communicator* const world = options.comms != nullptr ? options.comms->world() : nullptr;
  ExecutorOptions eopts;
  eopts.seed = options.seed;
  eopts.comms = options.comms;
  eopts.device = options.device;
  std::unique_ptr<Tracer> tracer;
  if (!options.trace_path.empty()) {
    tracer = std::make_unique<Tracer>(plan.rank());
    eopts.tracer = tracer.get();
  }
  eopts.comm_timeout_s = options.comm_timeout_s;
  const bool reporter = !plan.program().loss().empty();
  report.reports_loss = reporter;
  const bool progress = options.progress && reporter;
  auto created = Executor::Create(plan, eopts);
  if (!created.ok()) return created.status();
  Executor& executor = **created;

  const int64_t batch = plan.schedule().micro_batch_size() * std::max(1, plan.schedule().micro_batches()) *
                        std::max(1, plan.topology().dp_degree());
  if (batch <= 0) return absl::InvalidArgumentError("the plan has no batch size");
  report.batch_size = batch;
  report.predicted_peak_bytes = plan.memory().peak_bytes();

  // The data loader's staging buffers (see the prefetcher below): counted
  // apart from the rank's own bytes, as a GPU's pinned host buffers are.
  CpuAllocator loader_allocator;
  // The ops that read the labels fix how many classes the data may have.
  // Pipeline stages hold only their own ops, so the ranks share what they
  // found; every rank then opens the same data and fails the label check
  // alike, before any step.
  const std::vector<FeedSpec> feeds = FeedSpecs(plan.program());
  LabelConsumer consumer;
  if (const std::string label_feed = LabelFeedName(feeds); !label_feed.empty()) {
    consumer = FindLabelConsumer(plan.program(), label_feed);
  }
  if (world != nullptr && world->size() > 1) {
    auto shared = ShareLabelConsumer(consumer, *world, options.comm_timeout_s);
    if (!shared.ok()) return shared.status();
    consumer = *std::move(shared);
  }
  // Synthetic data without classes= has the program's classes.
  auto train_data = OpenDataset(options.data, feeds, options.seed, consumer.classes);
  if (!train_data.ok()) return absl::Status(train_data.status().code(), absl::StrCat("--data ", options.data, ": ", train_data.status().message()));
  std::unique_ptr<Dataset> eval_data;
  if (!options.eval_data.empty()) {
    auto d = OpenDataset(options.eval_data, feeds, options.seed, consumer.classes);
    if (!d.ok()) return absl::Status(d.status().code(), absl::StrCat("--eval_data ", options.eval_data, ": ", d.status().message()));
    eval_data = std::move(*d);
  }
  // Labels the program cannot take fail here, on every rank, before any step.
  if (auto s = CheckLabelsFit(**train_data, consumer, absl::StrCat("--data ", options.data)); !s.ok()) return s;
  if (eval_data) {
    if (auto s = CheckLabelsFit(*eval_data, consumer, absl::StrCat("--eval_data ", options.eval_data)); !s.ok()) {
      return s;
    }
  }
  (*train_data)->set_allocator(&loader_allocator);
  if (eval_data) {
    eval_data->set_allocator(options.device->host_accessible() ? options.device->allocator() : &loader_allocator);
  }
  const Dataset& data = **train_data;
  const int64_t steps_per_epoch = data.size() / batch;
  if (steps_per_epoch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--data ", options.data, " has ", data.size(),
                                                   " samples, fewer than one batch of ", batch));
  }
  report.steps_per_epoch = steps_per_epoch;
  const int64_t total_steps = options.steps > 0 ? options.steps : std::max<int64_t>(options.epochs, 1) * steps_per_epoch;
  executor.set_total_steps(total_steps);

  if (!options.save_dir.empty()) {
    if (auto s = CheckSaveTarget(options.save_dir, LoadsFromSaveFolder(options.load_dir, options.save_dir)); !s.ok()) {
      return s;
    }
  }
  if (!options.trace_path.empty()) {
    if (auto s = CheckWritableFile(options.trace_path, "--trace"); !s.ok()) return s;
  }
  if (auto s = executor.InitializeState(); !s.ok()) return s;
  if (!options.load_dir.empty()) {
    CheckpointSource source;
    auto ckpt = LoadCheckpointFrom(options.load_dir, &source);
    if (!ckpt.ok() && absl::IsNotFound(ckpt.status()) && SameFolder(options.load_dir, options.save_dir)) {
      // --load DIR --save DIR restarts a preempted job; its first start has nothing to load.
      if (reporter) std::fprintf(stderr, "note: no checkpoint in %s yet; starting at step 0\n", options.load_dir.c_str());
    } else if (!ckpt.ok()) {
      return absl::Status(ckpt.status().code(), absl::StrCat("--load ", options.load_dir, ": ", ckpt.status().message()));
    } else {
      auto step = CheckResumable(ckpt->metadata, batch, options.seed, total_steps);
      if (!step.ok()) {
        return absl::Status(step.status().code(), absl::StrCat("--load ", source.description, ": ", step.status().message()));
      }
      if (auto s = executor.LoadPersistentState(ckpt->tensors); !s.ok()) {
        return absl::Status(s.code(), absl::StrCat("--load ", source.description, ": ", s.message()));
      }
      executor.set_step(*step);
      report.loaded_from = source.description;
      // Said even under --quiet: which checkpoint a run continues is part of its record.
      if (reporter) {
        std::fprintf(stderr, "resuming from %s at step %lld\n", source.description.c_str(), static_cast<long long>(*step));
      }
    }
  }
  // The folder `latest` names is never rewritten in place: a run resumed from
  // an older step into the same folder must not be due to save that step.
  if (!options.save_dir.empty()) {
    absl::StatusOr<int64_t> latest = LatestStep(options.save_dir);
    if (!latest.ok()) return latest.status();
    const int64_t from = executor.step();
    if (*latest > from && (*latest == total_steps || (options.save_every > 0 && *latest % options.save_every == 0))) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--save ", options.save_dir, ": its latest checkpoint is step ", *latest, ", which this run (from step ", from,
          ") would save again; resume from ", options.save_dir, " itself, or save into another folder"));
    }
  }
  // Every rank writes its share of a step folder, and they agree that all did.
  auto save = [&]() -> absl::Status {
    Checkpoint ckpt;
    STRATA_ASSIGN_OR_RETURN(ckpt.tensors, executor.HostState());
    ckpt.metadata["epoch"] = absl::StrCat(executor.step() / steps_per_epoch);
    ckpt.metadata["data_position"] = absl::StrCat((executor.step() % steps_per_epoch) * batch);
    ckpt.metadata["batch_size"] = absl::StrCat(batch);
    ckpt.metadata["seed"] = absl::StrCat(options.seed);
    ckpt.metadata["program"] = plan.program().name();
    SaveStepOptions save_options;
    save_options.dir = options.save_dir;
    save_options.step = executor.step();
    save_options.rank = plan.rank();
    save_options.world_size = std::max(1, plan.topology().world_size());
    save_options.keep = options.keep_checkpoints;
    if (world != nullptr && world->size() > 1) {
      save_options.agree = [&](const absl::Status& mine) {
        return AgreeAllRanks(*world, mine, options.comm_timeout_s, "saving the checkpoint");
      };
    }
    if (auto s = SaveCheckpointStep(save_options, std::move(ckpt)); !s.ok()) return s;
    report.last_saved = absl::StrCat(options.save_dir, "/step-", executor.step());
    return absl::OkStatus();
  };

  if (world != nullptr && world->size() > 1) {
    const std::vector<std::pair<std::string, std::string>> settings = {
        {"--steps", absl::StrCat(options.steps)},
        {"--epochs", absl::StrCat(options.epochs)},
        {"--seed", absl::StrCat(options.seed)},
        {"--data", data.identity()},
        {"--eval_data", eval_data ? eval_data->identity() : "(none)"},
        {"the global batch", absl::StrCat(batch)},
        {"the loaded checkpoint's step", report.loaded_from.empty() ? "(none)" : absl::StrCat(executor.step())},
        {"--comm_timeout_s", absl::StrCat(options.comm_timeout_s)},
        {"--save_every", absl::StrCat(options.save_dir.empty() ? 0 : options.save_every)},
        // Every rank saves its share, or none does (the save is collective);
        // the paths may differ between machines that mount one filesystem.
        {"--save", options.save_dir.empty() ? "(none)" : "(a folder)"},
    };
    if (auto s = AgreeOnSettings(*world, settings, options.comm_timeout_s); !s.ok()) return s;
  }
  MetricsWriter metrics;
  if (reporter) {
    if (auto s = metrics.Open(options.metrics_path, !options.load_dir.empty()); !s.ok()) return s;
  }
  const std::string acc_fetch = AccuracyFetch(plan.program());
  const std::string eval_name = EvalName(options.eval_data);

  auto last_progress = Clock::now();
  const auto train_begin = Clock::now();
  const int64_t first_step = executor.step();
  int64_t next_stop_check = first_step + 1;
  auto evaluate = [&](int64_t epoch) -> absl::Status {
    if (!eval_data) return absl::OkStatus();
    auto m = RunEvaluation(executor, *eval_data, eval_name, options.eval_batch_size, acc_fetch);
    if (!m.ok()) return m.status();
    m->epoch = epoch;
    if (!reporter) return absl::OkStatus();
    metrics.Line(EvalMetricsJson(*m, executor.step()));
    if (progress) {
      std::fprintf(stderr, "eval %s at step %lld (epoch %lld): loss %.4f%s\n", eval_name.c_str(),
                   static_cast<long long>(executor.step()), static_cast<long long>(epoch),
                   m->loss, m->accuracy >= 0 ? absl::StrFormat(", accuracy %.4f", m->accuracy).c_str() : "");
    }
    report.evals.push_back(*m);
    return absl::OkStatus();
  };

  // The samples of a micro-batch depend only on (seed, epoch, position): the
  // loader reads them one micro-batch ahead, on its own thread, into its own
  // allocator; a micro-batch's forward copies them into this rank's, where
  // the memory plan counts them.
  FeedPrefetcher prefetcher(
      [&, order_epoch = int64_t{-1}, order = std::vector<int64_t>()](
          const FeedPrefetcher::Key& key) mutable -> absl::StatusOr<FeedPrefetcher::Feeds> {
        const int64_t epoch = key.step / steps_per_epoch;
        if (epoch != order_epoch) {
          order = EpochOrder(data.size(), options.seed, epoch);
          order_epoch = epoch;
        }
        const int64_t position = (key.step % steps_per_epoch) * batch + key.first;
        auto feeds = LoadBatch(data, absl::MakeConstSpan(order).subspan(position, key.rows));
        if (feeds.ok()) DropUnreadFeeds(executor, &*feeds);
        return feeds;
      });
  while (executor.step() < total_steps) {
    const int64_t step = executor.step();
    if (double seconds = 10; FaultRequested("slow_step", plan.rank(), step + 1, &seconds)) {
      absl::SleepFor(absl::Seconds(seconds));  // a slow but live rank (its heartbeat goes on)
    }
    const int64_t epoch = step / steps_per_epoch;
    const auto t0 = Clock::now();
    options.device->allocator()->ResetPeak();
    auto r = executor.TrainStep(
        [&](int64_t first, int64_t rows) -> absl::StatusOr<std::map<std::string, Tensor>> {
          std::optional<FeedPrefetcher::Key> next;
          if (first + rows < batch) {
            next = FeedPrefetcher::Key{step, first + rows, rows};
          } else if (step + 1 < total_steps) {
            next = FeedPrefetcher::Key{step + 1, 0, rows};
          }
          auto feeds = prefetcher.Get({step, first, rows}, next);
          if (!feeds.ok()) return feeds.status();
          for (auto& [name, t] : *feeds) {
            absl::StatusOr<Tensor> copy = t.CopyTo(options.device);
            if (!copy.ok()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for feed ", name));
            t = *std::move(copy);
          }
          return feeds;
        },
        0);
    report.measured_peak_bytes = std::max(report.measured_peak_bytes, options.device->allocator()->peak_bytes());
    if (!r.ok()) return absl::Status(r.status().code(), absl::StrCat("step ", step + 1, ": ", r.status().message()));
    if (r->has_loss && !std::isfinite(r->loss)) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step + 1, ": loss is ", r->loss,
                                                     "; training diverged (lower the learning rate?)"));
    }
    const double secs = Seconds(t0, Clock::now());
    StepMetrics m;
    m.step = step + 1;
    m.epoch = epoch + 1;  // counted from 1, as the progress lines do
    m.loss = r->loss;
    m.fetches = r->fetches;
    m.step_ms = secs * 1e3;
    m.samples_per_sec = batch / std::max(secs, 1e-9);
    metrics.Line(StepMetricsJson(m));
    report.steps.push_back(std::move(m));

    const auto now = Clock::now();
    if (progress && (Seconds(last_progress, now) >= 1.0 || executor.step() == total_steps)) {
      last_progress = now;
      const double elapsed = Seconds(train_begin, now);
      const int64_t done = executor.step() - first_step;
      const double rate = done * batch / std::max(elapsed, 1e-9);
      const double eta = (total_steps - executor.step()) * elapsed / std::max<int64_t>(done, 1);
      std::string fetches;
      for (const auto& [k, v] : r->fetches) absl::StrAppend(&fetches, " ", k, " ", absl::StrFormat("%.4f", v));
      std::fprintf(stderr, "step %lld/%lld epoch %lld loss %.4f%s %.0f samples/s ETA %s\n",
                   static_cast<long long>(executor.step()), static_cast<long long>(total_steps),
                   static_cast<long long>(epoch + 1), r->loss, fetches.c_str(), rate, FormatDuration(eta).c_str());
    }
    const bool epoch_end = executor.step() % steps_per_epoch == 0;
    if (epoch_end && options.steps == 0) {
      if (auto s = evaluate(epoch + 1); !s.ok()) return s;
    }
    // A stop request on any rank stops every rank after the same step.
    if (options.stop_signal && executor.step() < total_steps && executor.step() >= next_stop_check) {
      const double step_seconds = Seconds(train_begin, Clock::now()) / (executor.step() - first_step);
      const int64_t ahead = static_cast<int64_t>(kStopCheckPeriodSeconds / std::max(step_seconds, 1e-9));
      auto check = AgreeOnStop(options.stop_signal(), executor.step() + std::clamp<int64_t>(ahead, 1, 1 << 20),
                               world, options.comm_timeout_s);
      if (!check.ok()) return check.status();
      if (check->signal != 0) {
        report.stop_signal = check->signal;
        break;
      }
      next_stop_check = check->next_check;
    }
    if (!options.save_dir.empty() && options.save_every > 0 && executor.step() % options.save_every == 0 &&
        executor.step() < total_steps) {
      if (auto s = save(); !s.ok()) return s;
    }
  }
  if (options.steps > 0 && executor.step() > first_step && report.stop_signal == 0) {
    // Epochs count from 1: the one the last step fell in.
    if (auto s = evaluate((executor.step() - 1) / steps_per_epoch + 1); !s.ok()) return s;
  }

  if (!options.save_dir.empty() && executor.step() > first_step) {
    if (auto s = save(); !s.ok()) return s;
  }
  STRATA_ASSIGN_OR_RETURN(const auto final_state, executor.HostState());
  for (const auto& [name, t] : final_state) {
    std::vector<double>& out = report.final_state[name];
    out.resize(t.num_elements());
    for (int64_t i = 0; i < t.num_elements(); ++i) out[i] = t.ValueAt(i);
  }
  if (tracer) {
    if (auto s = tracer->Write(options.trace_path); !s.ok()) return s;
  }
  report.seconds = Seconds(t_begin, Clock::now());
  // Every rank's peak and busy/idle time, gathered for the summary line.
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  int64_t peak_measured = report.measured_peak_bytes, peak_predicted = report.predicted_peak_bytes;
  if (world != nullptr && world->size() > 1) {
    Tensor mine = Tensor::Empty(F64, {5});
    double* m = mine.data<double>();
    m[0] = plan.rank();
    m[1] = static_cast<double>(report.measured_peak_bytes);
    m[2] = static_cast<double>(report.predicted_peak_bytes);
    m[3] = executor.busy_seconds();
    m[4] = executor.wait_seconds();
    Tensor all = Tensor::Empty(F64, {static_cast<int64_t>(world->size()) * 5});
    if (auto s = world->AllGather(mine, &all)->Wait(absl::Seconds(options.comm_timeout_s)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("gathering the ranks' summaries: ", s.message()));
    }
    for (int r = 0; r < world->size(); ++r) {
      const double* v = all.data<double>() + 5 * r;
      ranks.push_back({{"rank", static_cast<int>(v[0])},
                       {"measured_peak_bytes", static_cast<int64_t>(v[1])},
                       {"predicted_peak_bytes", static_cast<int64_t>(v[2])},
                       {"busy_s", Metric(v[3])},
                       {"idle_s", Metric(v[4])}});
      if (r == 0 || static_cast<int64_t>(v[1]) > peak_measured) {
        // The job's peak: the rank that measured the most, with its prediction.
        peak_measured = static_cast<int64_t>(v[1]);
        peak_predicted = static_cast<int64_t>(v[2]);
      }
    }
  }
  if (reporter) {
    nlohmann::ordered_json summary = {{"steps", executor.step()},
                                      {"seconds", Metric(report.seconds)},
                                      {"measured_peak_bytes", peak_measured},
                                      {"predicted_peak_bytes", peak_predicted}};
    if (!ranks.empty()) summary["ranks"] = std::move(ranks);
    metrics.Line(JsonLine({{"summary", std::move(summary)}}));
  }
  return report;
}

}  // namespace strata
