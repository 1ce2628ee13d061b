#include "compiler/pass.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "compiler/validate.h"

namespace strata {

namespace {

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

void PhaseTimes::Add(absl::string_view phase, double seconds) {
  for (auto& [name, total] : entries_) {
    if (name == phase) {
      total += seconds;
      return;
    }
  }
  entries_.emplace_back(std::string(phase), seconds);
}

ScopedPhase::ScopedPhase(PhaseTimes* times, absl::string_view phase)
    : times_(times), phase_(times != nullptr ? std::string(phase) : std::string()), start_ns_(NowNs()) {}

ScopedPhase::~ScopedPhase() {
  if (times_ != nullptr) times_->Add(phase_, (NowNs() - start_ns_) * 1e-9);
}

std::vector<std::string> PassPipeline::PassNames() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.push_back(p->name());
  return names;
}

absl::StatusOr<bool> GraphPass::Run(Program& program, const CompileContext& ctx) {
  auto graph = Graph::FromProgram(program);
  if (!graph.ok()) return graph.status();
  auto changed = Run(**graph, ctx);
  if (changed.ok() && *changed) program = (*graph)->ToProgram();
  return changed;
}

absl::StatusOr<bool> ProgramPass::Run(Graph& graph, const CompileContext& ctx) {
  if (!Applies(ctx)) return false;
  Program program = graph.ToProgram();
  auto changed = Run(program, ctx);
  if (!changed.ok() || !*changed) return changed;
  auto rebuilt = Graph::FromProgram(program);
  if (!rebuilt.ok()) {
    return absl::InternalError(absl::StrCat("program invalid after pass '", name(), "': ", rebuilt.status().message()));
  }
  graph = std::move(**rebuilt);
  return true;
}

absl::Status PassPipeline::Run(Graph& graph, const CompileContext& ctx, PhaseTimes* times) {
  for (const auto& pass : passes_) {
    absl::StatusOr<bool> changed;
    {
      ScopedPhase phase(times, pass->name());
      changed = pass->Run(graph, ctx);
    }
    if (!changed.ok()) return changed.status();
    if (*changed) {
      ScopedPhase phase(times, "verify");
      if (auto s = VerifyGraph(graph); !s.ok()) {
        return absl::InternalError(absl::StrCat("program invalid after pass '", pass->name(), "': ", s.message()));
      }
    }
    if (pass->name() == dump_after_) {
      dumped_ = graph.ToProgram();
      dumped_valid_ = true;
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
