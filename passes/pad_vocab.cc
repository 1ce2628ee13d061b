#include "passes/pad_vocab.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

constexpr int64_t kPadTo = 64;
constexpr int64_t kRowAlignBytes = 16;
// Heads with fewer weight elements are left alone: their GEMMs are small
// (LtGemm stages none below 1e10 FLOPs either), and a classifier's few
// columns are not worth a pad and a slice a step.
constexpr int64_t kMinWeightElements = int64_t{1} << 20;

bool BoolAttr(const Graph& graph, int op, const char* name) {
  auto it = graph.attrs(op).find(name);
  return it != graph.attrs(op).end() && it->second.b();
}

class Padder {
 public:
  explicit Padder(Graph& graph) : graph_(graph), readers_(graph.Readers()), keep_(graph.num_vars(), true) {}

  absl::StatusOr<bool> Run() {
    bool changed = false;
    for (int op : std::vector<int>(graph_.ops())) {
      if (graph_.schema(op).type != "matmul" || BoolAttr(graph_, op, "transpose_a")) continue;
      const int y = graph_.outputs(op)[0];
      if (!IsUnreportedActivation(graph_, y) || readers_[y].size() != 1) continue;
      const int loss = readers_[y][0];
      if (graph_.schema(loss).type != "softmax_cross_entropy" || graph_.inputs(loss)[0] != y ||
          graph_.inputs(loss)[1] == y || graph_.stage(loss) != graph_.stage(op)) {
        continue;
      }
      auto classes = graph_.attrs(loss).find("classes");
      if (classes != graph_.attrs(loss).end() && classes->second.i() != 0) continue;
      const absl::Span<const int64_t> y_shape = graph_.shape(y);
      const int64_t v = y_shape.empty() ? -1 : y_shape.back();
      if (v <= 0 || v * static_cast<int64_t>(DataTypeSize(graph_.dtype(y))) % kRowAlignBytes == 0) continue;
      const bool tb = BoolAttr(graph_, op, "transpose_b");
      const int w = graph_.inputs(op)[1];
      const absl::Span<const int64_t> w_shape = graph_.shape(w);
      const int axis = tb ? 0 : 1;
      if (w_shape.size() != 2 || w_shape[axis] != v || w_shape[0] * w_shape[1] < kMinWeightElements) continue;
      STRATA_RETURN_IF_ERROR(Pad(op, loss, w, y, axis, v));
      changed = true;
    }
    if (!changed) return false;
    if (auto s = graph_.RetainVars(keep_); !s.ok()) return absl::InternalError(absl::StrCat("pad-vocab: ", s.message()));
    return true;
  }

 private:
  absl::Status Pad(int matmul, int loss, int w, int y, int axis, int64_t v) {
    const int64_t padded = PaddedVocab(v);
    std::vector<int64_t> w_shape(graph_.shape(w).begin(), graph_.shape(w).end());
    w_shape[axis] = padded;
    const std::string w_pad = FreshVarName(graph_, graph_.var_name(w), "@pad");
    if (graph_.AddVar(w_pad, graph_.dtype(w), w_shape, ACTIVATION) < 0) {
      return absl::InternalError(absl::StrCat("pad-vocab: var '", w_pad, "' exists already"));
    }
    keep_.push_back(true);
    std::vector<int64_t> y_shape(graph_.shape(y).begin(), graph_.shape(y).end());
    y_shape.back() = padded;
    const std::string y_pad = FreshVarName(graph_, graph_.var_name(y), "@pad");
    if (graph_.AddVar(y_pad, graph_.dtype(y), y_shape, ACTIVATION) < 0) {
      return absl::InternalError(absl::StrCat("pad-vocab: var '", y_pad, "' exists already"));
    }
    keep_.push_back(true);
    keep_[y] = false;

    Op pad = OpPlacedLike(graph_, matmul, "pad", graph_.role(matmul));
    pad.add_input(std::string(graph_.var_name(w)));
    pad.add_output(w_pad);
    (*pad.mutable_attr())["axis"].set_i(axis);
    (*pad.mutable_attr())["after"].set_i(padded - v);
    if (auto added = graph_.InsertOpBefore(matmul, pad); !added.ok()) return added.status();
    Op gemm = graph_.AsOp(matmul);
    gemm.set_input(1, w_pad);
    gemm.set_output(0, y_pad);
    if (auto s = graph_.ReplaceOp(matmul, gemm); !s.ok()) {
      return absl::InternalError(absl::StrCat("pad-vocab: ", graph_.OpLocation(matmul), ": ", s.message()));
    }
    Op reader = graph_.AsOp(loss);
    reader.set_input(0, y_pad);
    (*reader.mutable_attr())["classes"].set_i(v);
    if (auto s = graph_.ReplaceOp(loss, reader); !s.ok()) {
      return absl::InternalError(absl::StrCat("pad-vocab: ", graph_.OpLocation(loss), ": ", s.message()));
    }
    return absl::OkStatus();
  }

  Graph& graph_;
  const std::vector<std::vector<int>> readers_;
  std::vector<bool> keep_;
};

}  // namespace

int64_t PaddedVocab(int64_t v) { return (v + kPadTo - 1) / kPadTo * kPadTo; }

absl::StatusOr<bool> PadVocabPass::Run(Graph& graph, const CompileContext&) { return Padder(graph).Run(); }

}  // namespace strata
