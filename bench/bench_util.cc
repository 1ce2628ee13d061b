#include "bench/bench_util.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "passes/compile.h"
#include "compiler/program_text.h"

namespace strata {
namespace bench {

absl::StatusOr<RankPlan> CompileText(const std::string& text, int64_t batch_size, DeviceKind device_kind) {
  auto program = ParseProgramText(text, "generated");
  if (!program.ok()) return program.status();
  CompileOptions options;
  options.batch_size = batch_size;
  options.device_kind = device_kind;
  auto result = Compile(*program, Strategy(), options);
  if (!result.ok()) return result.status();
  if (result->plans.size() != 1) {
    return absl::InternalError(absl::StrCat("expected one rank plan, got ", result->plans.size()));
  }
  return std::move(result->plans[0]);
}

absl::StatusOr<RankPlan> CompileGenerated(const std::string& model, const GenOptions& options, int64_t batch_size,
                                          DeviceKind device_kind) {
  auto text = GenerateProgram(model, options);
  if (!text.ok()) return text.status();
  return CompileText(*text, batch_size, device_kind);
}

absl::StatusOr<std::map<std::string, Tensor>> SyntheticFeeds(const Executor& executor, int64_t batch_size,
                                                             int64_t num_classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::map<std::string, Tensor> feeds;
  for (const Var* v : executor.feeds()) {
    Shape shape;
    for (int64_t d : v->shape()) shape.push_back(d == -1 ? batch_size : d);
    Tensor t = Tensor::Empty(v->dtype(), shape);
    if (!t.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for feed '", v->name(), "'"));
    const int64_t n = t.num_elements();
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::uniform_int_distribution<int64_t> label(0, num_classes - 1);
    switch (v->dtype()) {
      case F32:
        for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = static_cast<float>(uniform(rng));
        break;
      case F64:
        for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = uniform(rng);
        break;
      case I64:
        for (int64_t i = 0; i < n; ++i) t.data<int64_t>()[i] = label(rng);
        break;
      default:
        return absl::UnimplementedError(absl::StrCat("feed '", v->name(), "': no synthetic data for ",
                                                     DataTypeName(v->dtype())));
    }
    feeds[v->name()] = std::move(t);
  }
  return feeds;
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

std::string FlagValue(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string eq = absl::StrCat("--", name, "=");
  const std::string bare = absl::StrCat("--", name);
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(eq, 0) == 0) return a.substr(eq.size());
    if (a == bare && i + 1 < argc) return argv[i + 1];
  }
  return fallback;
}

int64_t IntFlag(int argc, char** argv, const std::string& name, int64_t fallback) {
  int64_t v;
  std::string s = FlagValue(argc, argv, name, "");
  if (s.empty()) return fallback;
  if (!absl::SimpleAtoi(s, &v)) {
    std::fprintf(stderr, "--%s: expected an integer, got '%s'\n", name.c_str(), s.c_str());
    std::exit(2);
  }
  return v;
}

absl::StatusOr<StepTimes> TimeTrainSteps(Executor& executor, const std::map<std::string, Tensor>& feeds,
                                         int64_t warmup, int64_t steps) {
  StepTimes times;
  for (int64_t i = 0; i < std::max<int64_t>(warmup, 5); ++i) {
    auto r = executor.TrainStep(feeds, 0);
    if (!r.ok()) return r.status();
    if (!std::isfinite(r->loss)) return absl::InternalError(absl::StrCat("warm-up step ", i, ": loss ", r->loss));
    if (i == 0) times.first_loss = r->loss;
    times.last_loss = r->loss;
  }
  if (!(times.last_loss < times.first_loss)) {
    return absl::InternalError(absl::StrCat("validation: loss did not fall on a fixed batch (", times.first_loss,
                                            " -> ", times.last_loss, ")"));
  }
  times.ms.reserve(steps);
  for (int64_t i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    auto r = executor.TrainStep(feeds, 0);
    const double secs = SecondsSince(t0);
    if (!r.ok()) return r.status();
    if (!std::isfinite(r->loss)) return absl::InternalError(absl::StrCat("step ", i, ": loss ", r->loss));
    times.last_loss = r->loss;
    times.ms.push_back(secs * 1e3);
  }
  return times;
}

}  // namespace bench
}  // namespace strata
