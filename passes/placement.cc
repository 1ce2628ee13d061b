#include "passes/placement.h"

#include <algorithm>
#include <cctype>
#include <string>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"

namespace strata {

absl::StatusOr<int> ParseDeviceStage(const std::string& device) {
  std::string kind = device, number;
  size_t colon = device.find(':');
  if (colon != std::string::npos) {
    kind = device.substr(0, colon);
    number = device.substr(colon + 1);
  }
  if (kind != "gpu" && kind != "cpu") {
    return absl::InvalidArgumentError(absl::StrCat("malformed device '", device, "': expected \"gpu:N\" or \"cpu:N\""));
  }
  if (colon == std::string::npos) return 0;
  int stage;
  if (number.empty() || !absl::SimpleAtoi(number, &stage) || stage < 0 || stage > 4096 ||
      !std::all_of(number.begin(), number.end(), ::isdigit)) {
    return absl::InvalidArgumentError(absl::StrCat("malformed device '", device, "': the stage after ':' must be a number from 0"));
  }
  return stage;
}

absl::StatusOr<bool> PlacementPass::Run(Graph& graph, const CompileContext&) {
  auto error = [&](const std::string& where, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", what));
  };
  const std::vector<int> order = graph.ops();
  bool any_placed = false;
  // Every device is parsed first: a malformed one is the error, not an
  // earlier unplaced op that a placed program leaves without a stage.
  std::vector<int> placed_stage(graph.op_id_bound(), -1);
  for (int op : order) {
    if (graph.device(op).empty()) continue;
    any_placed = true;
    absl::StatusOr<int> stage = ParseDeviceStage(std::string(graph.device(op)));
    if (!stage.ok()) return error(graph.OpLocation(op), std::string(stage.status().message()));
    placed_stage[op] = *stage;
  }
  const std::vector<int> producer = graph.FirstWriters();
  for (int op : order) {
    if (!graph.device(op).empty()) {
      graph.set_stage(op, placed_stage[op]);
    } else if (any_placed) {
      int from = -1;
      for (int in : graph.inputs(op)) {
        if (producer[in] >= 0) {
          from = producer[in];
          break;
        }
      }
      if (from < 0) {
        return error(graph.OpLocation(op),
                     "has no device and reads no var produced by a placed op; in a program that places ops, give it a device");
      }
      graph.set_stage(op, graph.stage(from));
    } else {
      graph.set_stage(op, 0);
    }
    for (int in : graph.inputs(op)) {
      const int p = producer[in];
      if (p >= 0 && graph.stage(p) > graph.stage(op)) {
        return error(graph.OpLocation(op),
                     absl::StrCat("is on stage ", graph.stage(op), " but reads '", graph.var_name(in), "' from op #",
                                  graph.position(p), " '", graph.schema(p).type, "' on the later stage ",
                                  graph.stage(p), "; data must flow to the same or later stages"));
      }
    }
  }
  // Stages must be 0..K-1 with none skipped.
  std::set<int> stages;
  for (int op : order) stages.insert(graph.stage(op));
  int expect = 0;
  for (int s : stages) {
    if (s != expect) {
      const Program& fields = graph.program_fields();
      return error(fields.source_file().empty() ? fields.name() : fields.source_file(),
                   absl::StrCat("stage ", expect, " has no ops but stage ", s,
                                " does; device stages must be numbered 0, 1, ... without gaps"));
    }
    ++expect;
  }
  return true;
}

int NumStages(const Graph& graph) {
  int max_stage = 0;
  for (int op : graph.ops()) max_stage = std::max(max_stage, graph.stage(op));
  return max_stage + 1;
}

}  // namespace strata
