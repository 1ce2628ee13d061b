#include "compiler/pass.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "compiler/validate.h"

namespace strata {

int CompileContext::GroupAlong(absl::string_view axis) const {
  for (const CommGroup& g : mesh.GroupsOf(rank)) {
    if (g.axis_size() == 1 && g.axis(0) == axis) return g.id();
  }
  return 0;
}

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

std::vector<std::string> PassPipeline::PassNames(bool optional_only) const {
  std::vector<std::string> names;
  for (const auto& p : passes_) {
    if (const auto* nested = dynamic_cast<const PassPipeline*>(p.get())) {
      for (auto& n : nested->PassNames(optional_only)) names.push_back(std::move(n));
    } else if (!optional_only || p->optional()) {
      names.push_back(p->name());
    }
  }
  return names;
}

const Program* PassPipeline::dumped() const { return dumped_valid_ ? &dumped_ : nullptr; }

absl::StatusOr<bool> RunOnProgram(Pass& pass, Program& program, const CompileContext& ctx) {
  auto graph = Graph::FromProgram(program);
  if (!graph.ok()) return graph.status();
  auto changed = pass.Run(**graph, ctx);
  if (changed.ok() && *changed) program = (*graph)->ToProgram();
  return changed;
}

absl::StatusOr<bool> PassPipeline::Run(Graph& graph, const CompileContext& ctx) {
  bool any = false;
  for (const auto& pass : passes_) {
    auto* nested = dynamic_cast<PassPipeline*>(pass.get());
    if (nested != nullptr) {
      nested->set_dump_after(dump_after_);
      nested->set_times(times_);
      nested->set_disabled(disabled_);
    }
    if (pass->optional() && std::find(disabled_.begin(), disabled_.end(), pass->name()) != disabled_.end()) continue;
    absl::StatusOr<bool> changed;
    {
      // A nested pipeline times its own passes.
      ScopedPhase phase(nested != nullptr ? nullptr : times_, pass->name());
      changed = pass->Run(graph, ctx);
    }
    if (!changed.ok()) return changed.status();
    any |= *changed;
    if (*changed && nested == nullptr) {
      ScopedPhase phase(times_, "verify");
      if (auto s = VerifyGraph(graph); !s.ok()) {
        return absl::InternalError(absl::StrCat("program invalid after pass '", pass->name(), "': ", s.message()));
      }
    }
    if (nested != nullptr && nested->dumped() != nullptr) {
      dumped_ = *nested->dumped();
      dumped_valid_ = true;
    } else if (pass->name() == dump_after_) {
      dumped_ = graph.ToProgram();
      dumped_valid_ = true;
    }
  }
  return any;
}

}  // namespace strata
