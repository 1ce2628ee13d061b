#include "passes/data_parallel.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"
#include "passes/pass_helpers.h"

namespace strata {
namespace {

constexpr double kDefaultBucketMb = 25;  // PyTorch DDP's bucket_cap_mb

bool IsUpdate(OpRole role) { return role == OPTIMIZE || role == LR_SCHEDULE; }

struct Bucket {
  DataType dtype = DT_INVALID;
  bool late = false;  // its gradients are finished in the optimizer action
  int64_t elements = 0;
  std::vector<int> grads;  // in the order backward finishes them
};

// A bucket op placed like `like`. The post carries the group (a
// collective); the wait only finishes it.
Op OpLike(const Graph& graph, int like, const std::string& type, OpRole role, int group, int64_t bucket) {
  Op op = OpPlacedLike(graph, like, type, role);
  if (group >= 0) op.set_group(group);
  (*op.mutable_attr())["bucket"] = IntAttr(bucket);
  return op;
}

int64_t Elements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

int64_t BucketCapBytes(double bucket_mb) {
  return static_cast<int64_t>((bucket_mb > 0 ? bucket_mb : kDefaultBucketMb) * (1 << 20));
}

absl::StatusOr<bool> DataParallelPass::Run(Graph& graph, const CompileContext& ctx) {
  const int degree = ctx.dp_degree();
  if (degree <= 1) return false;
  const int group = ctx.GroupAlong("dp");
  const std::vector<int> order = graph.ops();
  std::vector<int> position(graph.op_id_bound(), -1);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  // Each rank's loss is the mean over its own share of the global batch (or
  // a sum, whose shares add up as they are).
  if (!ctx.summed_loss) {
    if (auto s = ScaleLossSeed(graph, 1.0 / degree, "data-parallel"); !s.ok()) return s;
  }

  // The gradients the optimizer reads (two parameters may share one), each
  // with the op that finishes it: its last writer before the update.
  std::vector<int> last_writer(graph.num_vars(), -1);
  for (int op : order) {
    if (IsUpdate(graph.role(op))) continue;  // the zeroing of a buffer after the update
    for (int out : graph.outputs(op)) last_writer[out] = op;
  }
  // A tied weight's gradient is finished in the optimizer action, where
  // its stages exchange their parts (passes/pipeline_split.cc): by the op
  // that writes it there first (the sum, or the replica's receive of it).
  std::vector<bool> late(graph.num_vars(), false);
  const std::vector<int> first_writer = graph.FirstWriters();
  std::vector<int> grads;
  absl::flat_hash_set<int> seen;
  for (const auto& [param, grad] : graph.program_fields().param_grad()) {
    const int g = graph.FindVar(grad);
    if (g < 0 || !seen.insert(g).second) continue;
    if (last_writer[g] < 0 && first_writer[g] >= 0 && graph.role(first_writer[g]) == OPTIMIZE) {
      last_writer[g] = first_writer[g];
      late[g] = true;
    }
    if (last_writer[g] < 0 || (graph.role(last_writer[g]) != BACKWARD && !late[g])) {
      return absl::InternalError(absl::StrCat("data-parallel: gradient '", grad, "' of '", param,
                                              "' is not finished by a backward op"));
    }
    if (!IsFloating(graph.dtype(g)) || graph.dtype(g) == BF16 || graph.dtype(g) == F16) {
      return absl::UnimplementedError(absl::StrCat("data-parallel: gradient '", grad, "' is ",
                                                   DataTypeName(graph.dtype(g)), "; buckets sum F32 and F64"));
    }
    for (int64_t d : graph.shape(g)) {
      if (d < 0) return absl::InternalError(absl::StrCat("data-parallel: gradient '", grad, "' has a batch dim"));
    }
    grads.push_back(g);
  }
  // A stage that trains nothing: only the seed may have changed.
  if (grads.empty()) return !graph.program_fields().loss_grad().empty();
  // In the order backward finishes them; one op's gradients (layer_norm_grad's
  // dgamma and dbeta) in its output order. Never the param_grad map's order,
  // which differs between processes: every rank must form the same buckets.
  auto key = [&](int g) {
    const absl::Span<const int> outs = graph.outputs(last_writer[g]);
    return std::make_pair(position[last_writer[g]], std::find(outs.begin(), outs.end(), g) - outs.begin());
  };
  std::sort(grads.begin(), grads.end(), [&](int a, int b) { return key(a) < key(b); });

  // Buckets of one dtype each, as DDP forms them: every dtype has one open
  // bucket, closed before it would pass the cap, so gradients of two dtypes
  // finishing in turn do not cut each other's buckets short. The gradients
  // finished in the optimizer action have buckets of their own, summed there.
  const int64_t cap = BucketCapBytes(ctx.strategy.data_parallel().bucket_mb());
  std::vector<Bucket> buckets;
  std::map<std::pair<DataType, bool>, size_t> open;  // (dtype, late) -> its open bucket
  for (int g : grads) {
    const DataType dtype = graph.dtype(g);
    const int64_t n = Elements(graph.shape(g));
    const std::pair<DataType, bool> kind(dtype, late[g]);
    auto it = open.find(kind);
    if (it == open.end() || static_cast<int64_t>((buckets[it->second].elements + n) * DataTypeSize(dtype)) > cap) {
      buckets.push_back({dtype, late[g], 0, {}});
      open[kind] = buckets.size() - 1;
    }
    Bucket& b = buckets[open[kind]];
    b.elements += n;
    b.grads.push_back(g);
  }

  const std::vector<std::vector<int>> readers = graph.Readers();
  // An update op that reads gradient g, as the optimizer reads it (the
  // zeroing of a gradient buffer writes it and is no reader; a tied
  // gradient's send to its replica stages carries this rank's sum, which
  // each replica sums over its own group).
  auto update_reads = [&](int op, int g) {
    const absl::Span<const int> outs = graph.outputs(op);
    return IsUpdate(graph.role(op)) && graph.schema(op).type != "send" &&
           std::find(outs.begin(), outs.end(), g) == outs.end();
  };
  std::map<int, int> after_anchor;  // anchor op -> the last op inserted after it
  std::map<int, int> reduced_of;    // gradient -> its sum over the group
  for (size_t k = 0; k < buckets.size(); ++k) {
    const Bucket& b = buckets[k];
    const std::string bucket_name = absl::StrCat("@dp_bucket.", k);
    const int bucket_var = graph.AddVar(bucket_name, b.dtype, {b.elements}, SCRATCH);
    if (bucket_var < 0) return absl::InternalError(absl::StrCat("data-parallel: var '", bucket_name, "' exists already"));

    // Posted after the op that finishes the bucket's last gradient.
    const int finisher = last_writer[b.grads.back()];
    Op post = OpLike(graph, finisher, "bucket_allreduce", b.late ? OPTIMIZE : BACKWARD, group, static_cast<int64_t>(k));
    post.add_input(bucket_name);
    for (int g : b.grads) post.add_input(std::string(graph.var_name(g)));
    post.add_output(bucket_name);
    auto anchor = after_anchor.find(finisher);
    absl::StatusOr<int> posted = graph.InsertOpAfter(anchor == after_anchor.end() ? finisher : anchor->second, post);
    if (!posted.ok()) return posted.status();
    after_anchor[finisher] = *posted;

    // Waited for before the first update op that reads one of its gradients.
    int first_reader = -1;
    for (int g : b.grads) {
      for (int c : readers[g]) {
        if (!update_reads(c, g)) continue;
        if (first_reader < 0 || position[c] < position[first_reader]) first_reader = c;
      }
    }
    if (first_reader < 0) {
      return absl::InternalError(absl::StrCat("data-parallel: no optimizer op reads bucket ", k, "'s gradients"));
    }
    Op wait = OpLike(graph, first_reader, "bucket_wait", OPTIMIZE, -1, static_cast<int64_t>(k));
    wait.add_input(bucket_name);
    std::vector<int64_t> shape_attr;
    for (int g : b.grads) {
      const std::string name = absl::StrCat(graph.var_name(g), "@dp");
      const int reduced = graph.AddVar(name, b.dtype, graph.shape(g), ACTIVATION);
      if (reduced < 0) return absl::InternalError(absl::StrCat("data-parallel: var '", name, "' exists already"));
      reduced_of[g] = reduced;
      wait.add_output(name);
      shape_attr.push_back(static_cast<int64_t>(graph.shape(g).size()));
      for (int64_t d : graph.shape(g)) shape_attr.push_back(d);
    }
    (*wait.mutable_attr())["shapes"] = IntsAttr(shape_attr);
    if (auto s = graph.InsertOpBefore(first_reader, wait); !s.ok()) return s.status();
  }

  // The update ops read the sums.
  for (const auto& [g, reduced] : reduced_of) {
    for (int c : readers[g]) {
      if (!update_reads(c, g)) continue;
      const std::vector<int> ins(graph.inputs(c).begin(), graph.inputs(c).end());
      for (size_t i = 0; i < ins.size(); ++i) {
        if (ins[i] != g) continue;
        if (auto s = graph.SetInput(c, static_cast<int>(i), reduced); !s.ok()) return s;
      }
    }
  }
  for (auto& [param, grad] : *graph.mutable_program_fields().mutable_param_grad()) {
    const int g = graph.FindVar(grad);
    auto it = g >= 0 ? reduced_of.find(g) : reduced_of.end();
    if (it != reduced_of.end()) grad = std::string(graph.var_name(it->second));
  }
  return true;
}

}  // namespace strata
