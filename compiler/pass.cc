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

absl::Status PassPipeline::Run(Program& program, const CompileContext& ctx, PhaseTimes* times) {
  for (const auto& pass : passes_) {
    absl::StatusOr<bool> changed;
    {
      ScopedPhase phase(times, pass->name());
      changed = pass->Run(program, ctx);
    }
    if (!changed.ok()) return changed.status();
    if (*changed) {
      ScopedPhase phase(times, "verify");
      auto index = VerifyAndIndexProgram(program, ctx.index_cache != nullptr ? ctx.index_cache->Get(program) : nullptr);
      if (!index.ok()) {
        if (ctx.index_cache != nullptr) ctx.index_cache->Clear();
        return absl::InternalError(absl::StrCat("program invalid after pass '", pass->name(), "': ",
                                                index.status().message()));
      }
      if (ctx.index_cache != nullptr) ctx.index_cache->Set(program, *std::move(index));
    }
    if (pass->name() == dump_after_) {
      dumped_ = program;
      dumped_valid_ = true;
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
