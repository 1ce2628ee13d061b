// Strata's side of the PyTorch cross-check (tests/torch/torch_crosscheck.py
// is the other): for each case it generates a program, sets its optimizer
// section, compiles it, trains 20 steps with Train() and writes, under
// OUT/<case>/,
//   program.json         the user program exactly as compiled (protobuf JSON)
//   init.safetensors     the parameters before the first step
//   batches.safetensors  the 20 batches, "step<k>.<feed>", in the trainer's order
//   strata.safetensors   the parameters after the last step
//   case.json            case settings and Strata's per-step losses
// Usage: torch_crosscheck_driver --out DIR [--cases a,b,...] [--list]

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "passes/compile.h"
#include "compiler/program_text.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "passes/loss_scaling.h"
#include "runtime/checkpoint.h"
#include "runtime/dataset.h"
#include "runtime/executor.h"
#include "runtime/thread_pool.h"
#include "runtime/trainer.h"
#include "tools/model_gen.h"

namespace strata {
namespace {

constexpr int64_t kSteps = 20;

struct CrossCheckCase {
  std::string name;
  std::string model;      // mlp | resmlp | convnet (tools/model_gen.h)
  std::string dtype;      // F32 | F64
  std::vector<int64_t> layers;
  int blocks = 0;         // resmlp only
  std::string optimizer;  // Optimizer proto text; replaces the generated section
  std::string data;       // TrainOptions::data
  int64_t batch = 32;
  uint64_t seed = 1;
  double tolerance = 0;   // max relative error the python side accepts
  // "BF16": the strategy's mixed_precision dtype (torch runs the forward under
  // torch.autocast('cpu', dtype=torch.bfloat16)); empty: none.
  std::string mixed_precision;
  // With "F16": the strategy's mixed_precision.loss_scaling, as proto text
  // (torch's side runs GradScaler's rule with the same values).
  std::string loss_scaling;
};

// Every optimizer, weight decay (L2 and decoupled), each lr schedule (with
// and without warm-up, cosine past its decay_steps) and clipping appear in at
// least one case. Convnets stay small-batch to keep the float64 torch run fast.
//
// The F32 Adam cases set epsilon 1e-5: at step 1 Adam's update is
// lr * g / (|g| + eps), so where a gradient element cancels to ~eps its float32
// rounding error is amplified by up to lr / eps. At the default 1e-8 that is
// 1e5, and torch float32 itself then misses torch float64 by ~6e-4 on the
// convnet's fc1.w: a bar of 1e-4 would measure conditioning, not Strata.
std::vector<CrossCheckCase> Cases() {
  const std::vector<int64_t> mlp = {784, 64, 32, 10};
  const std::vector<int64_t> convnet = {};  // fixed architecture
  return {
      {"mlp_f64_sgd_wd_step_decay", "mlp", "F64", mlp, 0,
       "sgd { learning_rate: 0.1 } weight_decay: 0.001 lr_schedule { step_decay { step_size: 6 gamma: 0.5 } }",
       "fashion_mnist", 32, 11, 1e-9},
      {"mlp_f64_momentum", "mlp", "F64", mlp, 0, "momentum { learning_rate: 0.05 momentum: 0.9 }", "fashion_mnist",
       32, 12, 1e-9},
      {"mlp_f64_nesterov_wd_clip", "mlp", "F64", mlp, 0,
       "momentum { learning_rate: 0.05 momentum: 0.9 nesterov: true } weight_decay: 0.0005 clip_global_norm: 1.0",
       "fashion_mnist", 32, 13, 1e-9},
      {"mlp_f64_adam_wd_cosine", "mlp", "F64", mlp, 0,
       "adam { learning_rate: 0.002 } weight_decay: 0.0001 lr_schedule { cosine {} }", "fashion_mnist", 32, 14, 1e-9},
      {"mlp_f64_adamw_warmup_step_decay", "mlp", "F64", mlp, 0,
       "adamw { learning_rate: 0.002 beta1: 0.85 beta2: 0.99 epsilon: 1e-7 } weight_decay: 0.05 "
       "lr_schedule { warmup_steps: 4 step_decay { step_size: 5 gamma: 0.7 } }",
       "fashion_mnist", 32, 15, 1e-9},
      {"resmlp_f64_adam_cosine_warmup_clip", "resmlp", "F64", {64, 48, 10}, 2,
       "adam { learning_rate: 0.003 } lr_schedule { warmup_steps: 5 cosine { decay_steps: 18 alpha: 0.1 } } "
       "clip_global_norm: 1.3",
       "synthetic:size=2048", 32, 16, 1e-9},
      {"convnet_f64_momentum_wd", "convnet", "F64", convnet, 0,
       "momentum { learning_rate: 0.02 momentum: 0.9 } weight_decay: 0.0005", "synthetic:size=512", 8, 17, 1e-9},
      // Every model under every optimizer.
      {"resmlp_f64_sgd_step_decay", "resmlp", "F64", {64, 48, 10}, 2,
       "sgd { learning_rate: 0.05 } lr_schedule { step_decay { step_size: 7 gamma: 0.5 } }", "synthetic:size=2048", 32,
       20, 1e-9},
      {"resmlp_f64_nesterov_wd", "resmlp", "F64", {64, 48, 10}, 2,
       "momentum { learning_rate: 0.02 momentum: 0.9 nesterov: true } weight_decay: 0.001", "synthetic:size=2048", 32,
       21, 1e-9},
      {"resmlp_f64_adamw", "resmlp", "F64", {64, 48, 10}, 2,
       "adamw { learning_rate: 0.002 } weight_decay: 0.02 lr_schedule { cosine {} }", "synthetic:size=2048", 32, 22,
       1e-9},
      {"convnet_f64_sgd_clip", "convnet", "F64", convnet, 0, "sgd { learning_rate: 0.05 } clip_global_norm: 0.5",
       "synthetic:size=512", 8, 23, 1e-9},
      {"convnet_f64_adamw_warmup", "convnet", "F64", convnet, 0,
       "adamw { learning_rate: 0.001 } weight_decay: 0.01 lr_schedule { warmup_steps: 5 constant {} }",
       "synthetic:size=512", 8, 24, 1e-9},
      {"mlp_f32_adam_cosine", "mlp", "F32", mlp, 0,
       "adam { learning_rate: 0.001 epsilon: 1e-5 } lr_schedule { cosine {} }", "fashion_mnist", 32, 18, 1e-4},
      {"convnet_f32_adam", "convnet", "F32", convnet, 0, "adam { learning_rate: 0.001 epsilon: 1e-5 }",
       "fashion_mnist", 16, 19, 1e-4},
      // Mixed precision against torch's CPU autocast on a 2-layer MLP: both
      // run the matmuls (forward and backward) on bf16 operands with float32
      // accumulation and round their outputs to bf16, the rest in float32.
      // Measured (2 threads): loss 1.1e-7, weights 1.3e-7 from autocast after
      // 20 steps, against 1.1e-3 and 3.2e-2 from torch without autocast. The
      // bar is the F32 cases' 1e-4: a bf16 rounding that lands the other way
      // (a different summation order) moves an element by 2^-8, so a bar
      // near the measured 1e-7 would be brittle; 1e-4 still tells autocast
      // from float32 by 10x on the loss and 300x on the weights.
      {"mlp2_bf16_sgd", "mlp", "F32", {784, 64, 10}, 0, "sgd { learning_rate: 0.1 }", "fashion_mnist", 32, 25,
       1e-4, "BF16"},
      // F16 with dynamic loss scaling against torch with F16 storage and
      // float32 math emulated by casts (CPU torch 1.13 has no half matmul)
      // and GradScaler's rule: init_scale 2^26 overflows F16 in backward, so
      // the first updates are skipped while the scale backs off; growth_interval 4
      // grows it again until it overflows once more. Steps skipped and
      // scales must be equal; losses and weights within the F32 bar.
      {"mlp2_f16_momentum_loss_scaling", "mlp", "F32", {784, 64, 10}, 0,
       "momentum { learning_rate: 0.05 momentum: 0.9 }", "fashion_mnist", 32, 26, 1e-4, "F16",
       "init_scale: 67108864 growth_interval: 4"},
  };
}

absl::Status MakeDirs(const std::string& path) {
  std::string prefix;
  for (const auto& part : absl::StrSplit(path, '/')) {
    prefix += std::string(part) + "/";
    if (part.empty()) continue;
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return absl::PermissionDeniedError(absl::StrCat("cannot create ", prefix));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

std::vector<FeedSpec> FeedSpecsOf(const Executor& e) {
  std::vector<FeedSpec> specs;
  for (const Var* v : e.feeds()) {
    specs.push_back({v->name(), v->dtype(), std::vector<int64_t>(v->shape().begin(), v->shape().end())});
  }
  return specs;
}

// A parameter's final value from TrainReport::final_state (doubles), back in
// its own dtype and shape: exact, since F32 -> double -> F32 round-trips.
absl::StatusOr<Tensor> FinalTensor(const Var& v, const std::vector<double>& values) {
  Shape shape(v.shape().begin(), v.shape().end());
  Tensor t = Tensor::Empty(v.dtype(), shape);
  if (t.num_elements() != static_cast<int64_t>(values.size())) {
    return absl::InternalError(absl::StrCat("final state of ", v.name(), " has ", values.size(), " values, expected ",
                                            t.num_elements()));
  }
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    if (v.dtype() == F32) {
      t.data<float>()[i] = static_cast<float>(values[i]);
    } else {
      t.data<double>()[i] = values[i];
    }
  }
  return t;
}

absl::Status RunCase(const CrossCheckCase& c, const std::string& dir) {
  GenOptions gen;
  gen.dtype = c.dtype;
  if (!c.layers.empty()) gen.layers = c.layers;
  if (c.blocks > 0) gen.blocks = c.blocks;
  auto text = GenerateProgram(c.model, gen);
  if (!text.ok()) return text.status();
  auto program = ParseProgramText(*text, c.name + ".pbtxt");
  if (!program.ok()) return program.status();
  program->clear_optimizer();
  if (!google::protobuf::TextFormat::ParseFromString(c.optimizer, program->mutable_optimizer())) {
    return absl::InvalidArgumentError(absl::StrCat(c.name, ": bad optimizer text: ", c.optimizer));
  }

  CompileOptions copts;
  copts.batch_size = c.batch;
  Strategy strategy;
  if (!c.mixed_precision.empty()) {
    DataType dtype = DT_INVALID;
    if (!DataType_Parse(c.mixed_precision, &dtype)) return absl::InvalidArgumentError(c.mixed_precision);
    strategy.mutable_mixed_precision()->set_dtype(dtype);
    if (!c.loss_scaling.empty() &&
        !google::protobuf::TextFormat::ParseFromString(c.loss_scaling,
                                                        strategy.mutable_mixed_precision()->mutable_loss_scaling())) {
      return absl::InvalidArgumentError(absl::StrCat(c.name, ": bad loss_scaling text: ", c.loss_scaling));
    }
  }
  auto compiled = Compile(*program, strategy, copts);
  if (!compiled.ok()) return compiled.status();
  const RankPlan& plan = compiled->plans[0];

  // Initial parameters and the batches, from a second executor over the same
  // plan and the same public functions the trainer uses.
  ExecutorOptions eopts;
  eopts.seed = c.seed;
  auto executor = Executor::Create(plan, eopts);
  if (!executor.ok()) return executor.status();
  if (auto s = (*executor)->InitializeState(); !s.ok()) return s;
  std::set<std::string> params;
  for (const Var& v : program->var()) {
    if (v.kind() == PARAM) params.insert(v.name());
  }
  Checkpoint init;
  for (const auto& [name, t] : (*executor)->PersistentState()) {
    if (params.count(name)) init.tensors[name] = t;
  }
  if (auto s = WriteSafetensorsFile(dir + "/init.safetensors", init); !s.ok()) return s;

  auto data = OpenDataset(c.data, FeedSpecsOf(**executor), c.seed);
  if (!data.ok()) return data.status();
  const int64_t steps_per_epoch = (*data)->size() / c.batch;
  if (steps_per_epoch < 1) return absl::InvalidArgumentError(absl::StrCat(c.name, ": dataset smaller than a batch"));
  Checkpoint batches;
  std::vector<int64_t> order, indices(c.batch);
  for (int64_t step = 0; step < kSteps; ++step) {
    const int64_t epoch = step / steps_per_epoch, position = (step % steps_per_epoch) * c.batch;
    if (step % steps_per_epoch == 0) order = EpochOrder((*data)->size(), c.seed, epoch);
    for (int64_t i = 0; i < c.batch; ++i) indices[i] = order[position + i];
    std::vector<Tensor> tensors;
    if (auto s = (*data)->GetBatch(indices, &tensors); !s.ok()) return s;
    for (size_t f = 0; f < tensors.size(); ++f) {
      batches.tensors[absl::StrCat("step", step, ".", (*data)->feeds()[f].name)] = std::move(tensors[f]);
    }
  }
  if (auto s = WriteSafetensorsFile(dir + "/batches.safetensors", batches); !s.ok()) return s;

  TrainOptions topts;
  topts.data = c.data;
  topts.steps = kSteps;
  topts.seed = c.seed;
  topts.progress = false;
  auto report = Train(plan, topts);
  if (!report.ok()) return report.status();
  if (static_cast<int64_t>(report->steps.size()) != kSteps) {
    return absl::InternalError(absl::StrCat(c.name, ": Train ran ", report->steps.size(), " steps"));
  }
  Checkpoint final_params;
  for (const Var& v : program->var()) {
    if (v.kind() != PARAM) continue;
    auto it = report->final_state.find(v.name());
    if (it == report->final_state.end()) return absl::InternalError(absl::StrCat("no final state for ", v.name()));
    auto t = FinalTensor(v, it->second);
    if (!t.ok()) return t.status();
    final_params.tensors[v.name()] = *std::move(t);
  }
  if (auto s = WriteSafetensorsFile(dir + "/strata.safetensors", final_params); !s.ok()) return s;

  std::string json;
  google::protobuf::util::JsonPrintOptions jopts;
  jopts.preserve_proto_field_names = true;
  if (auto s = google::protobuf::util::MessageToJsonString(*program, &json, jopts); !s.ok()) {
    return absl::InternalError(absl::StrCat(c.name, ": program to JSON: ", s.ToString()));
  }
  if (auto s = WriteText(dir + "/program.json", json); !s.ok()) return s;

  std::vector<std::string> losses, scales, skipped;
  for (const StepMetrics& m : report->steps) {
    losses.push_back(absl::StrFormat("%.17g", m.loss));
    if (m.has_loss_scale) scales.push_back(absl::StrFormat("%.17g", m.loss_scale));
    if (m.has_loss_scale) skipped.push_back(m.skipped_update ? "true" : "false");
  }
  std::string scaling = "null";
  if (UsesLossScaling(strategy)) {
    const LossScaling ls = EffectiveLossScaling(strategy);
    scaling = absl::StrFormat(
        "{\"init_scale\": %.17g, \"growth_factor\": %.17g, \"backoff_factor\": %.17g, \"growth_interval\": %d, "
        "\"loss_scales\": [%s], \"skipped\": [%s]}",
        ls.init_scale(), ls.growth_factor(), ls.backoff_factor(), ls.growth_interval(), absl::StrJoin(scales, ", "),
        absl::StrJoin(skipped, ", "));
  }
  std::string case_json = absl::StrFormat(
      "{\"name\": \"%s\", \"model\": \"%s\", \"dtype\": \"%s\", \"data\": \"%s\", \"batch_size\": %d, "
      "\"steps\": %d, \"seed\": %d, \"tolerance\": %.17g, \"threads\": %d, \"strata_seconds\": %.6f, "
      "\"mixed_precision\": \"%s\", \"loss_scaling\": %s, \"losses\": [%s]}\n",
      c.name, c.model, c.dtype, c.data, c.batch, kSteps, c.seed, c.tolerance, IntraOpThreads(), report->seconds,
      c.mixed_precision, scaling,
      absl::StrJoin(losses, ", "));
  return WriteText(dir + "/case.json", case_json);
}

int Main(int argc, char** argv) {
  std::string out;
  std::set<std::string> only;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (arg == "--cases" && i + 1 < argc) {
      for (const auto& s : absl::StrSplit(argv[++i], ',', absl::SkipEmpty())) only.insert(std::string(s));
    } else if (arg == "--list") {
      list = true;
    } else {
      std::fprintf(stderr, "usage: %s --out DIR [--cases a,b,...] [--list]\n", argv[0]);
      return 2;
    }
  }
  const std::vector<CrossCheckCase> cases = Cases();
  if (list) {
    for (const auto& c : cases) std::printf("%s\n", c.name.c_str());
    return 0;
  }
  if (out.empty()) {
    std::fprintf(stderr, "usage: %s --out DIR [--cases a,b,...] [--list]\n", argv[0]);
    return 2;
  }
  std::set<std::string> known;
  for (const auto& c : cases) known.insert(c.name);
  for (const auto& name : only) {
    if (!known.count(name)) {
      std::fprintf(stderr, "error: --cases: unknown case '%s' (see --list)\n", name.c_str());
      return 2;
    }
  }
  std::vector<std::string> written;
  for (const auto& c : cases) {
    if (!only.empty() && !only.count(c.name)) continue;
    const std::string dir = absl::StrCat(out, "/", c.name);
    absl::Status s = MakeDirs(dir);
    if (s.ok()) s = RunCase(c, dir);
    if (!s.ok()) {
      std::fprintf(stderr, "error: case %s: %s\n", c.name.c_str(), std::string(s.message()).c_str());
      return 1;
    }
    std::fprintf(stderr, "strata: %s done\n", c.name.c_str());
    written.push_back(c.name);
  }
  if (auto s = WriteText(out + "/cases.txt", absl::StrJoin(written, "\n") + "\n"); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace strata

int main(int argc, char** argv) { return strata::Main(argc, argv); }
