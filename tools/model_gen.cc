#include "tools/model_gen.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace strata {
namespace {

// Estimated work of a layer per sample, to balance stages: 2 per multiply-add
// plus kElementCost per element an elementwise op writes (about what the
// compiler's cost model charges for the bytes it moves).
constexpr double kElementCost = 8;
double LinearCost(int64_t in, int64_t out) { return 2.0 * in * out + 2 * kElementCost * out; }

// The stage of each layer: K contiguous groups of layers, every group
// non-empty, with the largest group's estimated work as small as it can be
// (DeepSpeed's PipelineModule partitions by a per-layer weight the same way).
// Bisection on the largest group's work; a greedy pass packs layers up to it,
// closing a group early only to leave a layer for each stage still to fill.
std::vector<int> BalancedStages(const std::vector<double>& cost, int stages) {
  const int n = static_cast<int>(cost.size());
  auto pack = [&](double limit, std::vector<int>* stage_of) {
    int group = 0;
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      // Layers i..n-1 are just enough for the stages after this one.
      const bool leave_for_rest = n - i == stages - group - 1;
      if (i > 0 && (sum + cost[i] > limit || leave_for_rest)) {
        if (group + 1 == stages) return false;  // the last stage would exceed the limit
        ++group;
        sum = 0;
      }
      sum += cost[i];
      if (stage_of != nullptr) (*stage_of)[i] = group;
    }
    return true;
  };
  double lo = 0, hi = 0;
  for (double c : cost) {
    lo = std::max(lo, c);
    hi += c;
  }
  for (int iter = 0; iter < 60 && hi - lo > 1e-9 * hi; ++iter) {
    const double mid = 0.5 * (lo + hi);
    (pack(mid, nullptr) ? hi : lo) = mid;
  }
  std::vector<int> stage_of(n, 0);
  pack(hi, &stage_of);
  return stage_of;
}

// Emits program text; layer i of n goes on stage stage_of_[i] of K.
class Writer {
 public:
  // `cost`: each layer's estimated work per sample, which places the layers
  // on the stages.
  Writer(const GenOptions& o, const std::vector<double>& cost)
      : o_(o), stage_of_(o.stages > 1 ? BalancedStages(cost, o.stages) : std::vector<int>(cost.size(), 0)) {}

  std::string Device(int layer) const {
    if (o_.stages <= 1) return "";
    return absl::StrCat(" device: \"gpu:", stage_of_[layer], "\"");
  }
  void Feed(const std::string& name, const std::string& dtype, const std::string& shape) {
    absl::StrAppend(&vars_, "var { name: \"", name, "\" dtype: ", dtype, " shape: ", shape, " kind: FEED }\n");
  }
  // PyTorch's default for Linear/Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weight and bias.
  void Param(const std::string& name, const std::string& shape, double fan_in, const std::string& init = "") {
    double bound = 1.0 / std::sqrt(fan_in);
    std::string i = init.empty() ? absl::StrFormat("uniform { low: %.9g high: %.9g }", -bound, bound) : init;
    absl::StrAppend(&vars_, "var { name: \"", name, "\" dtype: ", o_.dtype, " shape: ", shape, " kind: PARAM init { ", i, " } }\n");
  }
  void Op(int layer, const std::string& type, const std::vector<std::string>& in, const std::vector<std::string>& out,
          const std::string& attrs = "") {
    absl::StrAppend(&ops_, "op { type: \"", type, "\" input: [\"", absl::StrJoin(in, "\", \""), "\"] output: [\"",
                    absl::StrJoin(out, "\", \""), "\"]", attrs.empty() ? "" : " " + attrs, Device(layer), " }\n");
  }
  std::string Finish(const std::string& header, const std::string& logits, int last_layer) {
    Op(last_layer, "softmax_cross_entropy", {logits, "label"}, {"loss"});
    Op(last_layer, "accuracy", {logits, "label"}, {"acc"}, "attr { key: \"k\" value { i: 1 } }");
    return absl::StrCat(header, vars_, ops_, "loss: \"loss\"\nfetch: \"acc\"\n", Optimizer(1e-3, 0, ""));
  }
  // The program's text with `tail` (loss, fetches) before the optimizer.
  // `adam_lr`: the learning rate when none was asked for and the optimizer is
  // adam or adamw; `adamw_decay`: adamw's weight decay; `cosine`: the cosine
  // schedule's fields.
  std::string Text(const std::string& header, const std::string& tail, double adam_lr, double adamw_decay,
                   const std::string& cosine) const {
    return absl::StrCat(header, vars_, ops_, tail, Optimizer(adam_lr, adamw_decay, cosine));
  }

 private:
  std::string Optimizer(double adam_lr, double adamw_decay, const std::string& cosine) const {
    const std::string& opt = o_.optimizer;
    double lr = o_.learning_rate;
    if (lr == 0) lr = (opt == "adam" || opt == "adamw") ? adam_lr : 0.05;
    std::string body = absl::StrFormat("learning_rate: %g", lr);
    if (opt == "momentum") absl::StrAppend(&body, " momentum: 0.9");
    std::string decay = opt == "adamw" && adamw_decay > 0 ? absl::StrFormat(" weight_decay: %g", adamw_decay) : "";
    std::string sched = o_.cosine ? absl::StrCat(" lr_schedule { cosine {", cosine, "} }") : "";
    return absl::StrCat("optimizer { ", opt, " { ", body, " }", decay, sched, " }\n");
  }

 public:

 private:
  const GenOptions& o_;
  std::vector<int> stage_of_;
  std::string vars_, ops_;
};

std::string Shape(std::initializer_list<int64_t> dims) { return absl::StrCat("[", absl::StrJoin(dims, ", "), "]"); }

// --layers for mlp and resmlp: an input and an output width at least, each
// in 1..2^20.
absl::Status CheckLayers(const std::vector<int64_t>& layers) {
  if (layers.size() < 2) return absl::InvalidArgumentError("--layers needs at least an input and an output width");
  for (int64_t w : layers) {
    if (w <= 0 || w > (1 << 20)) return absl::InvalidArgumentError(absl::StrCat("--layers: width ", w, " must be in 1..1048576"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Mlp(const GenOptions& o) {
  if (auto s = CheckLayers(o.layers); !s.ok()) return s;
  const int n = static_cast<int>(o.layers.size()) - 1;
  if (o.stages > n) return absl::InvalidArgumentError(absl::StrCat("--stages ", o.stages, " exceeds the ", n, " layers"));
  std::vector<double> cost;
  for (int i = 0; i < n; ++i) cost.push_back(LinearCost(o.layers[i], o.layers[i + 1]));
  Writer w(o, cost);
  w.Feed("image", o.dtype, Shape({-1, o.layers[0]}));
  w.Feed("label", "I64", "[-1]");
  std::string h = "image";
  for (int i = 0; i < n; ++i) {
    std::string p = absl::StrCat("fc", i + 1);
    w.Param(p + ".w", Shape({o.layers[i], o.layers[i + 1]}), o.layers[i]);
    w.Param(p + ".b", Shape({o.layers[i + 1]}), o.layers[i]);
    w.Op(i, "matmul", {h, p + ".w"}, {p + ".xw"});
    w.Op(i, "add", {p + ".xw", p + ".b"}, {p + ".y"});
    h = p + ".y";
    if (i + 1 < n) {
      w.Op(i, "relu", {h}, {absl::StrCat("h", i + 1)});
      h = absl::StrCat("h", i + 1);
      if (o.dropout > 0) {
        w.Op(i, "dropout", {h}, {h + ".drop"}, absl::StrFormat("attr { key: \"p\" value { f: %g } }", o.dropout));
        h += ".drop";
      }
    }
  }
  return w.Finish(absl::StrCat("# MLP ", absl::StrJoin(o.layers, "-"), " (strata gen mlp)\nname: \"mlp\"\n"), h, n - 1);
}

absl::StatusOr<std::string> ResMlp(const GenOptions& o) {
  if (auto s = CheckLayers(o.layers); !s.ok()) return s;
  if (o.blocks < 1 || o.blocks > 100000) return absl::InvalidArgumentError("--blocks must be in 1..100000");
  const int64_t in = o.layers.front(), width = o.layers.size() > 2 ? o.layers[1] : 128, classes = o.layers.back();
  const int n = o.blocks + 2;
  if (o.stages > n) return absl::InvalidArgumentError(absl::StrCat("--stages ", o.stages, " exceeds the ", n, " layers"));
  // Embedding, blocks (two width x width layers, layer_norm, gelu, residual), head.
  std::vector<double> cost(n, 2 * LinearCost(width, width) + 4 * kElementCost * width);
  cost.front() = LinearCost(in, width);
  cost.back() = LinearCost(width, classes);
  Writer w(o, cost);
  w.Feed("image", o.dtype, Shape({-1, in}));
  w.Feed("label", "I64", "[-1]");
  w.Param("embed.w", Shape({in, width}), in);
  w.Param("embed.b", Shape({width}), in);
  w.Op(0, "matmul", {"image", "embed.w"}, {"embed.xw"});
  w.Op(0, "add", {"embed.xw", "embed.b"}, {"h0"});
  std::string h = "h0";
  for (int b = 0; b < o.blocks; ++b) {
    std::string p = absl::StrCat("block", b);
    w.Param(p + ".ln.g", Shape({width}), 1, "constant { value: 1 }");
    w.Param(p + ".ln.b", Shape({width}), 1, "constant { value: 0 }");
    w.Param(p + ".fc1.w", Shape({width, width}), width);
    w.Param(p + ".fc1.b", Shape({width}), width);
    w.Param(p + ".fc2.w", Shape({width, width}), width);
    w.Param(p + ".fc2.b", Shape({width}), width);
    w.Op(b + 1, "layer_norm", {h, p + ".ln.g", p + ".ln.b"}, {p + ".ln"});
    w.Op(b + 1, "matmul", {p + ".ln", p + ".fc1.w"}, {p + ".a"});
    w.Op(b + 1, "add", {p + ".a", p + ".fc1.b"}, {p + ".ab"});
    w.Op(b + 1, "gelu", {p + ".ab"}, {p + ".g"});
    std::string g = p + ".g";
    if (o.dropout > 0) {
      w.Op(b + 1, "dropout", {g}, {p + ".drop"}, absl::StrFormat("attr { key: \"p\" value { f: %g } }", o.dropout));
      g = p + ".drop";
    }
    w.Op(b + 1, "matmul", {g, p + ".fc2.w"}, {p + ".c"});
    w.Op(b + 1, "add", {p + ".c", p + ".fc2.b"}, {p + ".cb"});
    std::string next = absl::StrCat("h", b + 1);
    w.Op(b + 1, "add", {h, p + ".cb"}, {next});
    h = next;
  }
  w.Param("head.w", Shape({width, classes}), width);
  w.Param("head.b", Shape({classes}), width);
  w.Op(n - 1, "matmul", {h, "head.w"}, {"head.xw"});
  w.Op(n - 1, "add", {"head.xw", "head.b"}, {"logits"});
  return w.Finish(absl::StrCat("# Residual MLP, ", o.blocks, " blocks of width ", width, " (strata gen resmlp)\nname: \"resmlp\"\n"),
                  "logits", n - 1);
}

// Conv layers: (out channels, kernel, pool after); then fully connected widths.
struct ConvSpec { int64_t out, kernel, pad; bool pool; };

absl::StatusOr<std::string> ConvNet(const GenOptions& o, const std::string& name, const std::vector<ConvSpec>& convs,
                                    const std::vector<int64_t>& fcs, const std::string& comment) {
  const int n = static_cast<int>(convs.size() + fcs.size()) + 1;
  if (o.stages > n) return absl::InvalidArgumentError(absl::StrCat("--stages ", o.stages, " exceeds the ", n, " layers"));
  std::vector<double> cost;
  {
    int64_t c = 1, hw = 28;
    for (const ConvSpec& s : convs) {
      const int64_t out_hw = hw + 2 * s.pad - s.kernel + 1;
      // A multiply-add per output element and kernel tap, then bias, relu (and pool).
      cost.push_back(2.0 * out_hw * out_hw * s.out * c * s.kernel * s.kernel +
                     3 * kElementCost * out_hw * out_hw * s.out);
      hw = s.pool ? out_hw / 2 : out_hw;
      c = s.out;
    }
    int64_t in = c * hw * hw;
    for (int64_t width : fcs) {
      cost.push_back(LinearCost(in, width));
      in = width;
    }
    cost.push_back(LinearCost(in, 10));
  }
  Writer w(o, cost);
  w.Feed("image", o.dtype, "[-1, 1, 28, 28]");
  w.Feed("label", "I64", "[-1]");
  int64_t c = 1, hw = 28;
  std::string h = "image";
  int layer = 0;
  for (const ConvSpec& s : convs) {
    std::string p = absl::StrCat("conv", layer + 1);
    double fan_in = static_cast<double>(c * s.kernel * s.kernel);
    w.Param(p + ".w", Shape({s.out, c, s.kernel, s.kernel}), fan_in);
    w.Param(p + ".b", Shape({s.out, 1, 1}), fan_in);
    w.Op(layer, "conv2d", {h, p + ".w"}, {p + ".xw"},
         absl::StrFormat("attr { key: \"paddings\" value { list { i: [%d, %d] } } }", s.pad, s.pad));
    w.Op(layer, "add", {p + ".xw", p + ".b"}, {p + ".y"});
    w.Op(layer, "relu", {p + ".y"}, {p + ".r"});
    h = p + ".r";
    hw = hw + 2 * s.pad - s.kernel + 1;
    if (s.pool) {
      w.Op(layer, "max_pool2d", {h}, {p + ".pool"}, "attr { key: \"kernel_size\" value { list { i: [2, 2] } } }");
      h = p + ".pool";
      hw /= 2;
    }
    c = s.out;
    ++layer;
  }
  w.Op(layer - 1, "flatten", {h}, {"flat"});
  h = "flat";
  int64_t in = c * hw * hw;
  std::vector<int64_t> widths = fcs;
  widths.push_back(10);
  for (size_t i = 0; i < widths.size(); ++i) {
    std::string p = absl::StrCat("fc", i + 1);
    w.Param(p + ".w", Shape({in, widths[i]}), in);
    w.Param(p + ".b", Shape({widths[i]}), in);
    w.Op(layer, "matmul", {h, p + ".w"}, {p + ".xw"});
    w.Op(layer, "add", {p + ".xw", p + ".b"}, {p + ".y"});
    h = p + ".y";
    if (i + 1 < widths.size()) {
      w.Op(layer, "relu", {h}, {p + ".r"});
      h = p + ".r";
      if (o.dropout > 0) {
        w.Op(layer, "dropout", {h}, {p + ".drop"}, absl::StrFormat("attr { key: \"p\" value { f: %g } }", o.dropout));
        h = p + ".drop";
      }
    }
    in = widths[i];
    ++layer;
  }
  return w.Finish(absl::StrCat("# ", comment, "\nname: \"", name, "\"\n"), h, layer - 1);
}

// GPT-2 (Radford et al. 2019, as nanoGPT writes it): token and position
// embeddings, pre-norm blocks of causal self-attention and a 4x gelu MLP, a
// final layer_norm, and logits through the token embedding (tied). Layers for
// the stages: the embeddings, each block, then ln_f with the logits and loss.
absl::StatusOr<std::string> Gpt(const GenOptions& o) {
  if (o.blocks < 1 || o.blocks > 10000) return absl::InvalidArgumentError("--blocks must be in 1..10000");
  const int64_t d = o.d_model, heads = o.heads, t = o.seq, v = o.vocab;
  if (d < 1 || d > (1 << 16)) return absl::InvalidArgumentError("--d_model must be in 1..65536");
  if (heads < 1 || d % heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--heads ", heads, " must be >= 1 and divide --d_model ", d));
  }
  if (t < 1 || t > (1 << 20)) return absl::InvalidArgumentError("--seq must be in 1..1048576");
  if (o.gelu != "tanh" && o.gelu != "erf") {
    return absl::InvalidArgumentError(absl::StrCat("--gelu '", o.gelu, "': expected tanh or erf"));
  }
  if (v < 1 || v > 65536)
    return absl::InvalidArgumentError("--vocab must be in 1..65536 (token files hold uint16 ids)");
  const int n = o.blocks + 2;
  if (o.stages > n) {
    return absl::InvalidArgumentError(
        absl::StrCat("--stages ", o.stages, " exceeds the ", n, " layers (embeddings, ", o.blocks, " blocks, head)"));
  }
  const int64_t dh = d / heads;
  // Work per token: the block's matmuls (12 d^2 multiply-adds), causal
  // attention (about t d multiply-adds for scores and values), and ~20
  // elementwise passes over d; the head's logits (v d) and its softmax.
  std::vector<double> cost(n, 24.0 * d * d + 2.0 * t * d + 20 * kElementCost * d);
  cost.front() = 3 * kElementCost * d;
  cost.back() = 2.0 * v * d + 4 * kElementCost * v;
  Writer w(o, cost);
  const std::string normal = "normal { std: 0.02 }";
  // GPT-2 scales the residual projections' init by 1/sqrt(2 * blocks).
  const std::string residual = absl::StrFormat("normal { std: %.9g }", 0.02 / std::sqrt(2.0 * o.blocks));
  const std::string zero = "constant { value: 0 }", one = "constant { value: 1 }";
  auto dropout = [&](int layer, std::string* h) {
    if (o.dropout <= 0) return;
    w.Op(layer, "dropout", {*h}, {*h + ".drop"}, absl::StrFormat("attr { key: \"p\" value { f: %g } }", o.dropout));
    *h += ".drop";
  };
  auto ints = [](const std::vector<int64_t>& v) {
    return absl::StrCat("{ list { i: [", absl::StrJoin(v, ", "), "] } }");
  };
  auto linear = [&](int layer, const std::string& x, const std::string& p, int64_t in, int64_t out,
                    const std::string& init) {
    w.Param(p + ".w", Shape({in, out}), in, init);
    w.Param(p + ".b", Shape({out}), in, zero);
    w.Op(layer, "matmul", {x, p + ".w"}, {p + ".xw"});
    w.Op(layer, "add", {p + ".xw", p + ".b"}, {p + ".y"});
    return p + ".y";
  };
  auto layer_norm = [&](int layer, const std::string& x, const std::string& p) {
    w.Param(p + ".g", Shape({d}), 1, one);
    w.Param(p + ".b", Shape({d}), 1, zero);
    w.Op(layer, "layer_norm", {x, p + ".g", p + ".b"}, {p + ".y"});
    return p + ".y";
  };
  w.Feed("tokens", "I64", Shape({-1, t}));
  w.Feed("targets", "I64", Shape({-1, t}));
  w.Param("wte", Shape({v, d}), 1, normal);
  w.Param("wpe", Shape({t, d}), 1, normal);
  w.Op(0, "embedding", {"tokens", "wte"}, {"tok_emb"});
  w.Op(0, "add", {"tok_emb", "wpe"}, {"h0"});  // wpe [t, d] broadcast over the batch
  std::string h = "h0";
  dropout(0, &h);
  for (int b = 0; b < o.blocks; ++b) {
    const int layer = b + 1;
    const std::string p = absl::StrCat("block", b);
    std::string x = layer_norm(layer, h, p + ".ln1");
    std::string qkv = linear(layer, x, p + ".attn.qkv", d, 3 * d, normal);
    w.Op(layer, "split", {qkv}, {p + ".q2", p + ".k2", p + ".v2"},
         absl::StrCat("attr { key: \"axis\" value { i: 2 } } attr { key: \"sections\" value ", ints({d, d, d}), " }"));
    for (const char* part : {"q", "k", "v"}) {
      const std::string q = absl::StrCat(p, ".", part);
      w.Op(layer, "reshape", {q + "2"}, {q + "3"},
           absl::StrCat("attr { key: \"shape\" value ", ints({-1, t, heads, dh}), " }"));
      w.Op(layer, "transpose", {q + "3"}, {q}, absl::StrCat("attr { key: \"perm\" value ", ints({0, 2, 1, 3}), " }"));
    }
    w.Op(layer, "scaled_dot_product_attention", {p + ".q", p + ".k", p + ".v"}, {p + ".att", p + ".att_lse"},
         "attr { key: \"causal\" value { b: true } }");
    w.Op(layer, "transpose", {p + ".att"}, {p + ".att_t"},
         absl::StrCat("attr { key: \"perm\" value ", ints({0, 2, 1, 3}), " }"));
    w.Op(layer, "reshape", {p + ".att_t"}, {p + ".att_y"},
         absl::StrCat("attr { key: \"shape\" value ", ints({-1, t, d}), " }"));
    std::string a = linear(layer, p + ".att_y", p + ".attn.proj", d, d, residual);
    dropout(layer, &a);
    w.Op(layer, "add", {h, a}, {p + ".h"});
    x = layer_norm(layer, p + ".h", p + ".ln2");
    std::string f = linear(layer, x, p + ".mlp.fc", d, 4 * d, normal);
    w.Op(layer, "gelu", {f}, {p + ".mlp.g"},
         o.gelu == "tanh" ? "attr { key: \"approximate\" value { s: \"tanh\" } }" : "");
    std::string m = linear(layer, p + ".mlp.g", p + ".mlp.proj", 4 * d, d, residual);
    dropout(layer, &m);
    const std::string next = absl::StrCat("h", b + 1);
    w.Op(layer, "add", {p + ".h", m}, {next});
    h = next;
  }
  std::string x = layer_norm(n - 1, h, "ln_f");
  w.Op(n - 1, "matmul", {x, "wte"}, {"logits"}, "attr { key: \"transpose_b\" value { b: true } }");  // tied to wte
  w.Op(n - 1, "softmax_cross_entropy", {"logits", "targets"}, {"loss"});
  const std::string header = absl::StrFormat(
      "# GPT: %d blocks, d_model %d, %d heads, seq %d, vocab %d, gelu %s; logits tied to wte (strata gen gpt)\n"
      "name: \"gpt\"\n",
      o.blocks, d, heads, t, v, o.gelu);
  // nanoGPT's GPT-2 recipe: AdamW lr 6e-4, weight decay 0.1, cosine to lr/10.
  return w.Text(header, "loss: \"loss\"\n", 6e-4, 0.1, " alpha: 0.1 ");
}

}  // namespace

absl::StatusOr<std::string> GenerateProgram(const std::string& model, const GenOptions& given) {
  GenOptions options = given;
  if (options.optimizer.empty()) options.optimizer = model == "gpt" ? "adamw" : "adam";
  if (options.stages < 1 || options.stages > 64) return absl::InvalidArgumentError("--stages must be in 1..64");
  if (options.optimizer != "sgd" && options.optimizer != "momentum" && options.optimizer != "adam" && options.optimizer != "adamw") {
    return absl::InvalidArgumentError(absl::StrCat("--optimizer '", options.optimizer, "': expected sgd, momentum, adam or adamw"));
  }
  if (options.dtype != "F32" && options.dtype != "F64") return absl::InvalidArgumentError("--dtype must be F32 or F64");
  // As the program writes it (%g): 0.9999999999999999 would be written as 1.
  double written = 0;
  if (!(options.dropout >= 0 && absl::SimpleAtod(absl::StrFormat("%g", options.dropout), &written) && written < 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--dropout must be in [0, 1) as the program writes it (6 digits); got %g", options.dropout));
  }
  if (model == "mlp") return Mlp(options);
  if (model == "resmlp") return ResMlp(options);
  if (model == "gpt") return Gpt(options);
  if (model == "convnet") {
    return ConvNet(options, "convnet", {{32, 3, 1, true}, {64, 3, 1, true}}, {128},
                   "Two conv layers with max pooling, then 128-wide fc (strata gen convnet)");
  }
  if (model == "alexnet") {
    return ConvNet(options, "alexnet", {{32, 3, 1, true}, {64, 3, 1, true}, {128, 3, 1, false}, {128, 3, 1, false}, {64, 3, 1, true}},
                   {256, 256}, "AlexNet-style network sized for 28x28 inputs (strata gen alexnet)");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown model '", model, "': expected mlp, resmlp, convnet, alexnet or gpt"));
}

}  // namespace strata
