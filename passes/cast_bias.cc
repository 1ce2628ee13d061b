#include "passes/cast_bias.h"

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/pass_helpers.h"

namespace strata {
namespace {

// The 16-bit type `op` stores its output in where it reads an F32 bias it
// could read in that type (DT_INVALID where it cannot): a matmul_bias with
// out_dtype and no residual, or a matmul_bias_gelu storing both y and z in
// 16 bits (out_dtype and z_dtype, one type: the schema's rule).
DataType StoredType(const Graph& graph, int op) {
  const std::string& type = graph.schema(op).type;
  if (type != "matmul_bias" && type != "matmul_bias_gelu") return DT_INVALID;
  const absl::Span<const int> in = graph.inputs(op);
  if (in.size() != 3 || graph.dtype(in[2]) != F32) return DT_INVALID;
  const DataType y = graph.dtype(graph.outputs(op)[0]);
  if (!IsHalfFloating(y) || graph.dtype(in[0]) != y) return DT_INVALID;
  if (type == "matmul_bias_gelu" && graph.dtype(graph.outputs(op)[1]) != y) return DT_INVALID;
  return y;
}

}  // namespace

absl::StatusOr<bool> CastBiasPass::Run(Graph& graph, const CompileContext&) {
  const VarWriters writers = CountWriters(graph);
  // One cast per (bias, type, stage), made before the first op that reads it.
  std::map<std::tuple<int, DataType, int>, std::string> cast_of;
  bool changed = false;
  const std::vector<int> order = graph.ops();
  for (int op : order) {
    const DataType low = StoredType(graph, op);
    if (low == DT_INVALID) continue;
    const int bias = graph.inputs(op)[2];
    // A bias written more than once could change between two readers of
    // one cast (a parameter has no writer here: the optimizer comes later).
    if (writers.count[bias] > 1) continue;
    auto [it, fresh] = cast_of.try_emplace({bias, low, graph.stage(op)});
    if (fresh) {
      const std::string name = FreshVarName(graph, graph.var_name(bias), low == BF16 ? "@bf16" : "@f16");
      if (graph.AddVar(name, low, graph.shape(bias), ACTIVATION) < 0) {
        return absl::InternalError(absl::StrCat("cast-bias: var '", name, "' exists already"));
      }
      Op cast = OpPlacedLike(graph, op, "cast", graph.role(op));
      cast.add_input(std::string(graph.var_name(bias)));
      cast.add_output(name);
      (*cast.mutable_attr())["dtype"] = StringAttr(DataType_Name(low));
      if (absl::StatusOr<int> added = graph.InsertOpBefore(op, cast); !added.ok()) {
        return absl::InternalError(absl::StrCat("cast-bias: ", graph.OpLocation(op), ": ", added.status().message()));
      }
      it->second = name;
    }
    Op reads_low = graph.AsOp(op);  // a copy: AsOp's message is scratch
    reads_low.set_input(2, it->second);
    reads_low.mutable_attr()->erase("out_dtype");
    reads_low.mutable_attr()->erase("z_dtype");
    if (absl::Status s = graph.ReplaceOp(op, reads_low); !s.ok()) {
      return absl::InternalError(absl::StrCat("cast-bias: ", graph.OpLocation(op), ": ", s.message()));
    }
    changed = true;
  }
  return changed;
}

}  // namespace strata
