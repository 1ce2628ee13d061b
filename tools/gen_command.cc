// strata gen MODEL: prints a generated program (tools/model_gen.h) built from
// the gen flags.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tools/cli_common.h"
#include "tools/cli_flags.h"
#include "tools/commands.h"
#include "tools/model_gen.h"

namespace strata {
namespace cli {

namespace {

// The model-shaping flags each family reads (the optimizer's, --stages and
// --dtype apply to all): another one given is refused rather than ignored
// (gen mlp --heads 4 wrote the MLP as if it were not there).
const std::map<std::string, std::set<std::string>>& ModelFlags() {
  static const auto* flags = new std::map<std::string, std::set<std::string>>{
      {"mlp", {"layers", "dropout"}},
      {"resmlp", {"layers", "blocks", "dropout"}},
      {"convnet", {"dropout"}},
      {"alexnet", {"dropout"}},
      {"gpt", {"blocks", "d_model", "heads", "seq", "vocab", "gelu", "dropout"}},
  };
  return *flags;
}

}  // namespace

int GenCommand(const std::vector<std::string>& args, const std::set<std::string>& given) {
  if (args.empty()) {
    std::cerr << "error: strata gen needs one model name (mlp, resmlp, convnet, alexnet, gpt)\n" << kUsage;
    return kExitUsage;
  }
  if (args.size() > 1) {
    // Often a value after a boolean flag ("--cosine false" where
    // "--cosine=false" was meant): the word is left over.
    std::cerr << "error: strata gen takes one model name, got '" << args[0] << "' and then '" << args[1]
              << "' (a boolean flag takes its value after '=', as --cosine=false)\n"
              << kUsage;
    return kExitUsage;
  }
  if (auto model = ModelFlags().find(args[0]); model != ModelFlags().end()) {
    std::set<std::string> shaping;
    for (const auto& [name, used] : ModelFlags()) shaping.insert(used.begin(), used.end());
    for (const std::string& flag : given) {
      if (shaping.count(flag) && !model->second.count(flag)) {
        std::cerr << "error: --" << flag << " does not apply to strata gen " << args[0] << "; its model flags are --"
                  << absl::StrJoin(model->second, ", --") << "\n";
        return kExitUsage;
      }
    }
  }
  GenOptions o;
  o.layers.clear();
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_layers), ',')) {
    int64_t w;
    if (!absl::SimpleAtoi(part, &w)) {
      std::cerr << "error: --layers '" << absl::GetFlag(FLAGS_layers) << "': expected comma-separated widths\n";
      return kExitUsage;
    }
    o.layers.push_back(w);
  }
  o.stages = static_cast<int>(std::clamp<int64_t>(absl::GetFlag(FLAGS_stages), -1, 1 << 20));
  o.blocks = static_cast<int>(std::clamp<int64_t>(absl::GetFlag(FLAGS_blocks), -1, 1 << 20));
  o.optimizer = absl::GetFlag(FLAGS_optimizer);
  o.learning_rate = absl::GetFlag(FLAGS_lr);
  o.cosine = absl::GetFlag(FLAGS_cosine);
  o.dropout = absl::GetFlag(FLAGS_dropout);
  o.dtype = absl::GetFlag(FLAGS_dtype);
  o.d_model = absl::GetFlag(FLAGS_d_model);
  o.heads = absl::GetFlag(FLAGS_heads);
  o.seq = absl::GetFlag(FLAGS_seq);
  o.vocab = absl::GetFlag(FLAGS_vocab);
  o.gelu = absl::GetFlag(FLAGS_gelu);
  if (!(o.learning_rate >= 0) || !std::isfinite(o.learning_rate)) {
    std::cerr << "error: --lr must be > 0 and finite (0: the optimizer's default)\n";
    return kExitUsage;
  }
  auto text = GenerateProgram(args[0], o);
  if (!text.ok()) {
    std::cerr << "error: " << text.status().message() << "\n";
    return kExitUsage;
  }
  std::cout << *text;
  return 0;
}

}  // namespace cli
}  // namespace strata
