#include "compiler/pass.h"

#include "absl/strings/str_cat.h"
#include "compiler/validate.h"

namespace strata {

std::vector<std::string> PassPipeline::PassNames() const {
  std::vector<std::string> names;
  for (const auto& p : passes_) names.push_back(p->name());
  return names;
}

absl::Status PassPipeline::Run(Program& program, const CompileContext& ctx) {
  for (const auto& pass : passes_) {
    auto changed = pass->Run(program, ctx);
    if (!changed.ok()) return changed.status();
    if (*changed) {
      if (auto s = VerifyProgram(program); !s.ok()) {
        return absl::InternalError(absl::StrCat("program invalid after pass '", pass->name(), "': ", s.message()));
      }
    }
    if (pass->name() == dump_after_) {
      dumped_ = program;
      dumped_valid_ = true;
    }
  }
  return absl::OkStatus();
}

}  // namespace strata
