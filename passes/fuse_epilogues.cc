#include "passes/fuse_epilogues.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"
#include "proto/status_macros.h"

namespace strata {
namespace {

bool BoolAttr(const Graph& graph, int op, const char* name) {
  auto it = graph.attrs(op).find(name);
  return it != graph.attrs(op).end() && it->second.b();
}

// The one op reading var `v`, or -1 (none, several, or a var the program
// names as its loss or a fetch, which must stay).
int SoleReader(const Graph& graph, const std::vector<std::vector<int>>& readers, int v) {
  if (!IsUnreportedActivation(graph, v) || readers[v].size() != 1) return -1;
  return readers[v][0];
}

bool SamePlace(const Graph& graph, int a, int b) {
  return graph.stage(a) == graph.stage(b) && graph.role(a) == graph.role(b);
}

// A weight-gradient GEMM over (x, dy): the forward's a and what it reads as
// the product's gradient.
struct WeightGrad {
  int op = -1;
  int x = -1;
  bool transpose_b = false;  // dW laid out [N, K]
};

// Whether op `g` is a weight-gradient GEMM reading `d` as its dy, and over
// which x: matmul_shared_b_grad_b(x, d) without transpose_a (the GEMM over
// x's folded rows), or a 2-D matmul with transpose_a only, x^T @ d (dW
// [K, N]) or d^T @ x (dW [N, K]).
WeightGrad AsWeightGrad(const Graph& graph, int g, int d) {
  WeightGrad w;
  if (graph.erased(g) || graph.inputs(g).size() != 2 || graph.outputs(g).size() != 1) return w;
  const int p = graph.inputs(g)[0], q = graph.inputs(g)[1];
  if (p == q) return w;
  const std::string& type = graph.schema(g).type;
  if (type == "matmul_shared_b_grad_b") {
    if (q != d || BoolAttr(graph, g, "transpose_a")) return w;
    w.op = g;
    w.x = p;
    w.transpose_b = BoolAttr(graph, g, "transpose_b");
  } else if (type == "matmul") {
    if (!BoolAttr(graph, g, "transpose_a") || BoolAttr(graph, g, "transpose_b") || graph.shape(p).size() != 2 ||
        graph.shape(q).size() != 2) {
      return w;
    }
    w.op = g;
    w.x = q == d ? p : q;
    w.transpose_b = p == d;
  }
  return w;
}

// The bias gradient fused into the weight gradient's GEMM: for each
// sum_to_like(dy, bias) summing to a 1-D [N], a weight-gradient GEMM in the
// same stage and role over dy (or, under mixed precision, over dy's cast to
// BF16/F16, with its product cast back to F32 and read by that cast alone)
// becomes one matmul_bias_grad_b writing the GEMM's output (or the cast's)
// and the sum's. It takes the GEMM's place, so it is fused only when every
// reader of the sum comes after the GEMM. When the plan sums gradients over
// micro-batches or merged steps (`accumulating`), a 2-D F32/F64 matmul's
// weight gradient is left to the micro-batch pass, which makes it a
// matmul_accumulate (the GEMM adds into the buffer): one fusion or the other.
absl::StatusOr<bool> FuseBiasGradients(Graph& graph, bool accumulating) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  std::vector<bool> keep(graph.num_vars(), true);
  bool changed = false;
  const OpSchema& schema = *OpRegistry::Global().Find("matmul_bias_grad_b");
  for (int s : std::vector<int>(graph.ops())) {
    if (graph.erased(s) || graph.schema(s).type != "sum_to_like" || graph.outputs(s).size() != 1) continue;
    const int dy = graph.inputs(s)[0], like = graph.inputs(s)[1], dbias = graph.outputs(s)[0];
    const auto& ds = graph.shape(dy);
    const DataType dt = graph.dtype(dy);
    if ((dt != F32 && dt != F64) || ds.size() < 2 || graph.shape(like).size() != 1 || graph.shape(like)[0] != ds.back() ||
        ds.back() < 0 || graph.type(dbias) != graph.type(like)) {
      continue;
    }
    // The GEMM's dy: dy itself, or its cast to a 16-bit float (F32 dy).
    std::vector<int> operands = {dy};
    if (dt == F32) {
      for (int c : readers[dy]) {
        if (!graph.erased(c) && graph.schema(c).type == "cast" && graph.outputs(c).size() == 1 &&
            IsHalfFloating(graph.dtype(graph.outputs(c)[0])) && SamePlace(graph, c, s)) {
          operands.push_back(graph.outputs(c)[0]);
        }
      }
    }
    for (int d : operands) {
      WeightGrad w;
      for (int g : readers[d]) {
        if (!SamePlace(graph, g, s)) continue;
        w = AsWeightGrad(graph, g, d);
        if (w.op >= 0) break;
      }
      if (w.op < 0 || (accumulating && d == dy && graph.schema(w.op).type == "matmul")) continue;
      const int product = graph.outputs(w.op)[0];
      int dw = product;
      int widen = -1;  // the cast of a 16-bit product to F32, absorbed
      if (d != dy) {
        widen = SoleReader(graph, readers, product);
        if (widen < 0 || graph.schema(widen).type != "cast" || !SamePlace(graph, widen, w.op) ||
            graph.dtype(graph.outputs(widen)[0]) != F32) {
          continue;
        }
        dw = graph.outputs(widen)[0];
      }
      bool later = true;
      for (int r : readers[dbias]) later = later && graph.Precedes(w.op, r);
      if (!later) continue;
      Op fused = OpPlacedLike(graph, w.op, "matmul_bias_grad_b", graph.role(w.op));
      fused.add_input(std::string(graph.var_name(w.x)));
      fused.add_input(std::string(graph.var_name(d)));
      fused.add_output(std::string(graph.var_name(dw)));
      fused.add_output(std::string(graph.var_name(dbias)));
      AttrValue tb, tf32;
      tb.set_b(w.transpose_b);
      tf32.set_b(BoolAttr(graph, w.op, "allow_tf32"));
      (*fused.mutable_attr())["transpose_b"] = tb;
      (*fused.mutable_attr())["allow_tf32"] = tf32;
      if (auto st = CanonicalizeOp(schema, &fused); !st.ok()) {
        return absl::InternalError(absl::StrCat("fuse-epilogues: matmul_bias_grad_b: ", st.message()));
      }
      // The fused op must write what the two wrote: same shapes and dtypes.
      auto types = InferOutputTypes(schema, fused, {graph.type(w.x), graph.type(d)});
      if (!types.ok() || (*types)[0] != graph.type(dw) || (*types)[1] != graph.type(dbias)) continue;
      if (auto st = graph.ReplaceOp(w.op, fused); !st.ok()) {
        return absl::InternalError(absl::StrCat("fuse-epilogues: ", graph.OpLocation(w.op), ": ", st.message()));
      }
      graph.EraseOp(s);
      if (widen >= 0) {
        graph.EraseOp(widen);
        keep[product] = false;
      }
      changed = true;
      break;
    }
  }
  if (changed) {
    if (auto st = graph.RetainVars(keep); !st.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: ", st.message()));
    }
  }
  return changed;
}

absl::StatusOr<bool> FuseBiasAdds(Graph& graph) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  std::vector<bool> keep(graph.num_vars(), true);
  bool changed = false;
  const std::vector<int> order = graph.ops();
  for (int m : order) {
    if (graph.erased(m) || graph.schema(m).type != "matmul" || graph.outputs(m).size() != 1) continue;
    const int a = graph.inputs(m)[0], b = graph.inputs(m)[1];
    if (BoolAttr(graph, m, "transpose_a") || graph.shape(b).size() != 2 || graph.shape(a).size() < 2) continue;
    // matmul -> add, or matmul (low precision) -> cast to F32 -> add.
    int product = graph.outputs(m)[0];
    std::vector<int> dropped = {product};
    std::vector<int> erased = {m};
    int next = SoleReader(graph, readers, product);
    if (next < 0 || !SamePlace(graph, m, next)) continue;
    if (graph.schema(next).type == "cast" && IsHalfFloating(graph.dtype(product))) {
      const int wide = graph.outputs(next)[0];
      if (graph.dtype(wide) != F32) continue;
      erased.push_back(next);
      dropped.push_back(wide);
      product = wide;
      next = SoleReader(graph, readers, wide);
      if (next < 0 || !SamePlace(graph, m, next)) continue;
    }
    const int add = next;
    if (graph.schema(add).type != "add" || graph.inputs(add).size() != 2) continue;
    const int bias = graph.inputs(add)[0] == product ? graph.inputs(add)[1] : graph.inputs(add)[0];
    if (bias == product) continue;  // product + product
    const int y = graph.outputs(add)[0];
    const auto& ps = graph.shape(product);
    if (graph.shape(bias).size() != 1 || graph.shape(bias)[0] != ps.back() || graph.dtype(bias) != graph.dtype(product) ||
        graph.shape(y) != ps || graph.dtype(y) != graph.dtype(product)) {
      continue;
    }
    Op fused = OpPlacedLike(graph, add, "matmul_bias", graph.role(add));
    fused.add_input(std::string(graph.var_name(a)));
    fused.add_input(std::string(graph.var_name(b)));
    fused.add_input(std::string(graph.var_name(bias)));
    fused.add_output(std::string(graph.var_name(y)));
    AttrValue tb;
    tb.set_b(BoolAttr(graph, m, "transpose_b"));
    (*fused.mutable_attr())["transpose_b"] = tb;
    // The schema's defaults for the rest (allow_tf32), as every op in a plan has them.
    if (auto s = CanonicalizeOp(*OpRegistry::Global().Find("matmul_bias"), &fused); !s.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: matmul_bias: ", s.message()));
    }
    if (auto s = graph.ReplaceOp(add, fused); !s.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: ", graph.OpLocation(add), ": ", s.message()));
    }
    for (int op : erased) graph.EraseOp(op);
    for (int v : dropped) keep[v] = false;
    changed = true;
  }
  if (changed) {
    if (auto s = graph.RetainVars(keep); !s.ok()) return absl::InternalError(absl::StrCat("fuse-epilogues: ", s.message()));
  }
  return changed;
}

// Whether op `g` is a gelu of the tanh form (or, with `grad`, a gelu_grad of
// that form reading `z` as its x).
bool IsTanhGelu(const Graph& graph, int g, bool grad, int z) {
  if (graph.erased(g) || graph.schema(g).type != (grad ? "gelu_grad" : "gelu")) return false;
  if (grad && (graph.inputs(g).size() != 2 || graph.inputs(g)[0] != z || graph.inputs(g)[1] == z)) return false;
  auto it = graph.attrs(g).find("approximate");
  return it != graph.attrs(g).end() && it->second.s() == "tanh";
}

// The var a gelu of matmul_bias `m`'s output reads when mixed precision
// runs it in the low dtype: the output's one reader is a cast to a's 16-bit
// type (a, b 16-bit, bias F32), on m's stage and role, whose output is an
// activation the program does not report; that output, or -1 (also for the
// F32 gelu reading z itself).
int GeluReadsLowZ(const Graph& graph, const std::vector<std::vector<int>>& readers, int m, int z) {
  if (readers[z].size() != 1) return -1;
  const int cast = readers[z][0];
  if (graph.erased(cast) || graph.schema(cast).type != "cast" || graph.outputs(cast).size() != 1 ||
      !SamePlace(graph, m, cast)) {
    return -1;
  }
  const int low = graph.outputs(cast)[0];
  const DataType a = graph.dtype(graph.inputs(m)[0]);
  if (!IsHalfFloating(a) || graph.dtype(low) != a || graph.dtype(graph.inputs(m)[2]) != F32 ||
      !IsUnreportedActivation(graph, low)) {
    return -1;
  }
  return low;
}

// matmul_bias -> gelu (tanh form) becomes one matmul_bias_gelu writing the
// gelu's output y and the pre-activation z (cuBLASLt's GELU_AUX_BIAS, whose
// GELU is the tanh form; the erf form is a different function, left as it
// is). z may have other readers only if they are the backward's gelu_grad of
// the same form reading it as x: the fused op still writes z for them. It
// takes the matmul_bias's place (z's readers all come after it).
//
// Under mixed precision the gelu runs in the low dtype: matmul_bias -> cast
// to a's 16-bit type -> gelu, the gelu_grads reading the cast's output. The
// fused op writes that 16-bit z (z_dtype) and the gelu's 16-bit y
// (out_dtype); the F32 z and the cast go. Its y is the gelu of the float z,
// not of the rounded one: the fusion drops that rounding (cuBLASLt's
// epilogue computes the GELU before it stores D and aux, both in D's type).
absl::StatusOr<bool> FuseBiasGelus(Graph& graph) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  std::vector<bool> keep(graph.num_vars(), true);
  bool changed = false;
  const OpSchema& schema = *OpRegistry::Global().Find("matmul_bias_gelu");
  for (int m : std::vector<int>(graph.ops())) {
    if (graph.erased(m) || graph.schema(m).type != "matmul_bias" || graph.inputs(m).size() != 3 ||
        graph.outputs(m).size() != 1) {
      continue;
    }
    const int wide = graph.outputs(m)[0];
    if (!IsUnreportedActivation(graph, wide)) continue;
    const int low = GeluReadsLowZ(graph, readers, m, wide);
    const int z = low >= 0 ? low : wide;  // what the gelu and gelu_grads read
    int gelu = -1;
    bool others = false;  // a reader that is neither the one gelu nor a gelu_grad
    for (int r : readers[z]) {
      if (IsTanhGelu(graph, r, /*grad=*/false, z) && gelu < 0 && SamePlace(graph, m, r)) {
        gelu = r;
      } else if (!IsTanhGelu(graph, r, /*grad=*/true, z)) {
        others = true;
      }
    }
    if (gelu < 0 || others || graph.outputs(gelu).size() != 1) continue;
    const int y = graph.outputs(gelu)[0];
    Op fused = OpPlacedLike(graph, m, "matmul_bias_gelu", graph.role(m));
    for (int in : graph.inputs(m)) fused.add_input(std::string(graph.var_name(in)));
    fused.add_output(std::string(graph.var_name(y)));
    fused.add_output(std::string(graph.var_name(z)));
    for (const char* attr : {"transpose_b", "allow_tf32"}) {
      AttrValue v;
      v.set_b(BoolAttr(graph, m, attr));
      (*fused.mutable_attr())[attr] = v;
    }
    if (low >= 0) {
      const std::string stored = DataType_Name(graph.dtype(low));
      (*fused.mutable_attr())["z_dtype"] = StringAttr(stored);
      if (graph.dtype(y) == graph.dtype(low)) (*fused.mutable_attr())["out_dtype"] = StringAttr(stored);
    }
    if (auto st = CanonicalizeOp(schema, &fused); !st.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: matmul_bias_gelu: ", st.message()));
    }
    // The fused op must write what the two wrote (F32/F64 z: gelu's dtypes;
    // under mixed precision the 16-bit y and z).
    std::vector<TensorType> in_types;
    for (int in : graph.inputs(m)) in_types.push_back(graph.type(in));
    auto types = InferOutputTypes(schema, fused, in_types);
    if (!types.ok() || (*types)[0] != graph.type(y) || (*types)[1] != graph.type(z)) continue;
    if (low >= 0) {
      graph.EraseOp(readers[wide][0]);  // the cast
      keep[wide] = false;
    }
    if (auto st = graph.ReplaceOp(m, fused); !st.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: ", graph.OpLocation(m), ": ", st.message()));
    }
    graph.EraseOp(gelu);
    changed = true;
  }
  if (changed) {
    if (auto s = graph.RetainVars(keep); !s.ok()) return absl::InternalError(absl::StrCat("fuse-epilogues: ", s.message()));
  }
  return changed;
}

// matmul(a, b) -> gelu_grad(z, g) of the tanh form, g the GEMM's output
// and read by that gelu_grad alone: one matmul_gelu_grad(a, b, z) writing
// the gelu_grad's dz (cuBLASLt's DGELU epilogue, z its aux: the GEMM of a
// gelu's output gradient applies the gelu's derivative before it stores,
// and g is never written). The backward of an MLP's second layer under a
// tanh-form gelu. Only for a matmul with a 2-D b and no transpose_a (the
// GEMM over a's folded rows), a gelu_grad with no out_dtype whose z, g and
// dz share a's dtype (F32, F64, or under mixed precision the 16-bit type
// mixed precision runs the gelu in), the two on one stage and role, z
// and dz each written once. The fused op takes the matmul's place, where a
// and b are read as they were; where z is written after it (recomputed
// just before its first backward reader), the gelu_grad's, if a and b are
// not written between the two. After the
// forward's gelu fusion, which looks for gelu_grads among z's readers. For
// 16-bit operands the product is no longer rounded to 16 bits before the
// derivative multiplies it (one rounding fewer, as the other fused GEMMs).
absl::StatusOr<bool> FuseGeluGrads(Graph& graph) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  const VarWriters writers = CountWriters(graph);
  std::vector<bool> keep(graph.num_vars(), true);
  bool changed = false;
  const OpSchema& schema = *OpRegistry::Global().Find("matmul_gelu_grad");
  for (int g : std::vector<int>(graph.ops())) {
    if (graph.erased(g) || graph.schema(g).type != "gelu_grad" || graph.inputs(g).size() != 2 ||
        graph.outputs(g).size() != 1) {
      continue;
    }
    const int z = graph.inputs(g)[0], d = graph.inputs(g)[1], dz = graph.outputs(g)[0];
    if (!IsTanhGelu(graph, g, /*grad=*/true, z)) continue;
    if (auto set = graph.attrs(g).find("out_dtype"); set != graph.attrs(g).end() && !set->second.s().empty()) continue;
    const int m = writers.last[d];
    if (m < 0 || writers.count[d] != 1 || SoleReader(graph, readers, d) != g || graph.erased(m) ||
        graph.schema(m).type != "matmul" || graph.inputs(m).size() != 2 || graph.outputs(m).size() != 1 ||
        BoolAttr(graph, m, "transpose_a") || graph.shape(graph.inputs(m)[1]).size() != 2 || !SamePlace(graph, m, g)) {
      continue;
    }
    const DataType dtype = graph.dtype(graph.inputs(m)[0]);
    if (graph.dtype(z) != dtype || graph.dtype(d) != dtype || graph.dtype(dz) != dtype) continue;
    if (writers.count[z] != 1 || writers.last[z] < 0 || writers.count[dz] != 1) continue;
    // In the GEMM's place where z is written by then; else (a recomputed z,
    // which the recompute pass writes just before its first backward reader,
    // here after the GEMM) in the gelu_grad's, if a and b hold there what
    // the GEMM read: each written at most once, not between the two ops.
    const bool at_gemm = graph.Precedes(writers.last[z], m);
    if (!at_gemm) {
      bool held = true;
      for (int in : graph.inputs(m)) {
        const int w = writers.last[in];
        held = held && writers.count[in] <= 1 &&
               (w < 0 || graph.Precedes(w, m) || graph.Precedes(g, w));
      }
      if (!held) continue;
    }
    Op fused = OpPlacedLike(graph, m, "matmul_gelu_grad", graph.role(m));
    for (int in : graph.inputs(m)) fused.add_input(std::string(graph.var_name(in)));
    fused.add_input(std::string(graph.var_name(z)));
    fused.add_output(std::string(graph.var_name(dz)));
    for (const char* attr : {"transpose_b", "allow_tf32"}) {
      AttrValue v;
      v.set_b(BoolAttr(graph, m, attr));
      (*fused.mutable_attr())[attr] = v;
    }
    if (auto st = CanonicalizeOp(schema, &fused); !st.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: matmul_gelu_grad: ", st.message()));
    }
    // The fused op must write what the gelu_grad wrote.
    std::vector<TensorType> in_types;
    for (int in : graph.inputs(m)) in_types.push_back(graph.type(in));
    in_types.push_back(graph.type(z));
    auto types = InferOutputTypes(schema, fused, in_types);
    if (!types.ok() || (*types)[0] != graph.type(dz)) continue;
    const int place = at_gemm ? m : g;
    if (auto st = graph.ReplaceOp(place, fused); !st.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: ", graph.OpLocation(place), ": ", st.message()));
    }
    graph.EraseOp(at_gemm ? g : m);
    keep[d] = false;
    changed = true;
  }
  if (changed) {
    if (auto s = graph.RetainVars(keep); !s.ok()) return absl::InternalError(absl::StrCat("fuse-epilogues: ", s.message()));
  }
  return changed;
}

// matmul_bias -> add(r, y) or add(y, r), y an F32/F64 activation the
// program does not report, written once and read by that add alone, r of
// y's exact type (no broadcasting): the matmul_bias takes r as its residual
// and writes the add's output (cuBLASLt's C with beta 1: a residual
// connection's add summed in the GEMM's epilogue, not by a second pass over
// y and r). Only where r is written once, by an op before the matmul_bias
// (the fused op reads it where the matmul_bias stands), the add's output is
// written once, and the two share stage and role. After the gelu fusion
// (matmul_bias_gelu takes a matmul_bias of three inputs). No gradient op
// reads y (the add's gradient is its dy itself), so the backward stays as
// it is.
absl::StatusOr<bool> FuseResidualAdds(Graph& graph) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  VarWriters writers = CountWriters(graph);
  std::vector<bool> keep(graph.num_vars(), true);
  bool changed = false;
  const OpSchema& schema = *OpRegistry::Global().Find("matmul_bias");
  for (int m : std::vector<int>(graph.ops())) {
    if (graph.erased(m) || graph.schema(m).type != "matmul_bias" || graph.inputs(m).size() != 3 ||
        graph.outputs(m).size() != 1) {
      continue;
    }
    if (auto set = graph.attrs(m).find("out_dtype"); set != graph.attrs(m).end() && !set->second.s().empty()) continue;
    const int y = graph.outputs(m)[0];
    if ((graph.dtype(y) != F32 && graph.dtype(y) != F64) || writers.count[y] != 1) continue;
    const int add = SoleReader(graph, readers, y);
    if (add < 0 || graph.schema(add).type != "add" || graph.inputs(add).size() != 2 || graph.outputs(add).size() != 1 ||
        !SamePlace(graph, m, add)) {
      continue;
    }
    const int r = graph.inputs(add)[0] == y ? graph.inputs(add)[1] : graph.inputs(add)[0];
    const int out = graph.outputs(add)[0];
    if (r == y || graph.type(r) != graph.type(y) || graph.type(out) != graph.type(y) || writers.count[out] != 1) {
      continue;
    }
    if (writers.count[r] != 1 || writers.last[r] < 0 || !graph.Precedes(writers.last[r], m)) continue;
    Op fused = graph.AsOp(m);
    fused.add_input(std::string(graph.var_name(r)));
    fused.set_output(0, std::string(graph.var_name(out)));
    // The fused op must write what the add wrote.
    std::vector<TensorType> in_types;
    for (int in : graph.inputs(m)) in_types.push_back(graph.type(in));
    in_types.push_back(graph.type(r));
    auto types = InferOutputTypes(schema, fused, in_types);
    if (!types.ok() || (*types)[0] != graph.type(out)) continue;
    if (auto st = graph.ReplaceOp(m, fused); !st.ok()) {
      return absl::InternalError(absl::StrCat("fuse-epilogues: ", graph.OpLocation(m), ": ", st.message()));
    }
    graph.EraseOp(add);
    // The add's output is the fused op's now: a later residual add reading
    // it (parallel residual blocks: out = y2 + (y1 + h)) finds its writer.
    writers.last[out] = m;
    keep[y] = false;
    changed = true;
  }
  if (changed) {
    if (auto s = graph.RetainVars(keep); !s.ok()) return absl::InternalError(absl::StrCat("fuse-epilogues: ", s.message()));
  }
  return changed;
}

// add_n(r, p) where p is a layer_norm_grad's dx that nothing else reads:
// the layer_norm_grad takes r as its residual and writes the sum itself (a
// residual connection's gradient, summed where the layer norm's part is
// written instead of by a second pass over both). Only where r is written
// once, before the layer_norm_grad, so the op can read it where it stands.
absl::StatusOr<bool> FuseResidualGrads(Graph& graph) {
  const std::vector<std::vector<int>> readers = graph.Readers();
  VarWriters writers = CountWriters(graph);
  const std::vector<int>& writes = writers.count;
  std::vector<int>& writer = writers.last;
  std::vector<bool> keep(graph.num_vars(), true);
  bool changed = false;
  for (int sum : std::vector<int>(graph.ops())) {
    if (graph.schema(sum).type != "add_n" || graph.inputs(sum).size() != 2) continue;
    for (int i = 0; i < 2; ++i) {
      const int part = graph.inputs(sum)[i], r = graph.inputs(sum)[1 - i];
      const int ln = writer[part];
      if (ln < 0 || r == part || writes[part] != 1 || SoleReader(graph, readers, part) != sum) continue;
      // Not one that writes dx_low too (out_dtype): that copy would become the sum's.
      if (graph.schema(ln).type != "layer_norm_grad" || graph.inputs(ln).size() != 3 ||
          graph.outputs(ln).size() != 3 || graph.outputs(ln)[0] != part || !SamePlace(graph, ln, sum)) {
        continue;
      }
      if (graph.type(r) != graph.type(part) || writes[r] != 1 || writer[r] < 0 ||
          !graph.Precedes(writer[r], ln)) {
        continue;
      }
      Op fused = graph.AsOp(ln);
      fused.add_input(std::string(graph.var_name(r)));
      fused.set_output(0, std::string(graph.var_name(graph.outputs(sum)[0])));
      if (auto s = graph.ReplaceOp(ln, fused); !s.ok()) {
        return absl::InternalError(absl::StrCat("fuse-epilogues: ", graph.OpLocation(ln), ": ", s.message()));
      }
      writer[graph.outputs(sum)[0]] = ln;  // a later sum's r may be this one's output
      graph.EraseOp(sum);
      keep[part] = false;
      changed = true;
      break;
    }
  }
  if (changed) {
    if (auto s = graph.RetainVars(keep); !s.ok()) return absl::InternalError(absl::StrCat("fuse-epilogues: ", s.message()));
  }
  return changed;
}

}  // namespace

absl::StatusOr<bool> FuseEpiloguesPass::Run(Graph& graph, const CompileContext& ctx) {
  const Strategy& strategy = ctx.strategy;
  const bool accumulating = (strategy.has_pipeline() && strategy.pipeline().accumulate_steps() > 1) ||
                            strategy.gradient_merge().k_steps() > 1;
  STRATA_ASSIGN_OR_RETURN(const bool adds, FuseBiasAdds(graph));
  STRATA_ASSIGN_OR_RETURN(const bool gelus, FuseBiasGelus(graph));
  STRATA_ASSIGN_OR_RETURN(const bool gelu_grads, FuseGeluGrads(graph));
  STRATA_ASSIGN_OR_RETURN(const bool residual_adds, FuseResidualAdds(graph));
  STRATA_ASSIGN_OR_RETURN(const bool grads, FuseBiasGradients(graph, accumulating));
  STRATA_ASSIGN_OR_RETURN(const bool residuals, FuseResidualGrads(graph));
  return adds || gelus || gelu_grads || residual_adds || grads || residuals;
}

}  // namespace strata
