// Gradient checks for scaled_dot_product_attention: causal and not, a given
// scale, one position, odd sizes, more rows than one kernel row block (64),
// and each output alone carrying a gradient (the lse-only path fills dy with 0);
// layout "bthd" ([B, T, H, D]) causal and not, over two row blocks, with lse;
// the packed scaled_dot_product_attention_qkv the same way.

#include "compiler/testing/grad_check.h"

namespace strata {
namespace {

GradCheckInput Qkv(const char* name, std::vector<int64_t> shape, bool check_grad = true) {
  return GradCheckInput{name, F64, std::move(shape), -1.0, 1.0, {}, check_grad};
}

STRATA_REGISTER_GRAD_CHECKS({
    GradCheckCase{"scaled_dot_product_attention/causal",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb",
                  {Qkv("q", {2, 2, 5, 3}), Qkv("k", {2, 2, 5, 3}), Qkv("v", {2, 2, 5, 3})}},
    GradCheckCase{"scaled_dot_product_attention/not_causal",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "causal" value { b: false } })pb",
                  {Qkv("q", {2, 2, 5, 3}), Qkv("k", {2, 2, 5, 3}), Qkv("v", {2, 2, 5, 3})}},
    GradCheckCase{"scaled_dot_product_attention/scale",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "scale" value { f: 1.7 } })pb",
                  {Qkv("q", {1, 2, 4, 3}), Qkv("k", {1, 2, 4, 3}), Qkv("v", {1, 2, 4, 3})}},
    GradCheckCase{"scaled_dot_product_attention/not_causal_scale",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "causal" value { b: false } }
                       attr { key: "scale" value { f: 0.3 } })pb",
                  {Qkv("q", {1, 2, 4, 3}), Qkv("k", {1, 2, 4, 3}), Qkv("v", {1, 2, 4, 3})}},
    GradCheckCase{"scaled_dot_product_attention/one_position",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb",
                  {Qkv("q", {2, 3, 1, 4}), Qkv("k", {2, 3, 1, 4}), Qkv("v", {2, 3, 1, 4})}},
    GradCheckCase{"scaled_dot_product_attention/one_position_not_causal",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "causal" value { b: false } })pb",
                  {Qkv("q", {1, 2, 1, 3}), Qkv("k", {1, 2, 1, 3}), Qkv("v", {1, 2, 1, 3})}},
    GradCheckCase{"scaled_dot_product_attention/odd_sizes",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb",
                  {Qkv("q", {3, 1, 7, 5}), Qkv("k", {3, 1, 7, 5}), Qkv("v", {3, 1, 7, 5})}},
    GradCheckCase{"scaled_dot_product_attention/d1",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "causal" value { b: false } })pb",
                  {Qkv("q", {1, 1, 3, 1}), Qkv("k", {1, 1, 3, 1}), Qkv("v", {1, 1, 3, 1})}},
    // Two row blocks of the kernel (64 rows, then 6), causal and not.
    GradCheckCase{"scaled_dot_product_attention/two_row_blocks",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb",
                  {Qkv("q", {1, 1, 70, 2}), Qkv("k", {1, 1, 70, 2}), Qkv("v", {1, 1, 70, 2})}},
    GradCheckCase{"scaled_dot_product_attention/two_row_blocks_not_causal",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "causal" value { b: false } })pb",
                  {Qkv("q", {1, 1, 70, 2}), Qkv("k", {1, 1, 70, 2}), Qkv("v", {1, 1, 70, 2})}},
    // Only y carries a gradient (the grad op without dlse), then only lse.
    GradCheckCase{"scaled_dot_product_attention/y_only",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb",
                  {Qkv("q", {2, 2, 5, 3}), Qkv("k", {2, 2, 5, 3}), Qkv("v", {2, 2, 5, 3})},
                  1e-6,
                  /*outputs_without_grad=*/{1}},
    GradCheckCase{"scaled_dot_product_attention/lse_only",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "causal" value { b: false } })pb",
                  {Qkv("q", {2, 2, 5, 3}), Qkv("k", {2, 2, 5, 3}), Qkv("v", {2, 2, 5, 3})},
                  1e-6,
                  /*outputs_without_grad=*/{0}},
    // Gradients for some inputs only; the same var as q, k and v.
    GradCheckCase{"scaled_dot_product_attention/only_k",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"])pb",
                  {Qkv("q", {1, 2, 4, 3}, false), Qkv("k", {1, 2, 4, 3}), Qkv("v", {1, 2, 4, 3}, false)}},
    GradCheckCase{"scaled_dot_product_attention/self_attention",
                  R"pb(type: "scaled_dot_product_attention" input: ["x", "x", "x"] output: ["y", "lse"])pb",
                  {Qkv("x", {2, 1, 4, 3})}},
    // Layout "bthd": q, k, v [B, T, H, D] (B = 2, T = 5, H = 3, D = 2 all
    // differ, so a mixed-up axis shows), causal and not, two row blocks, and
    // only lse carrying a gradient.
    GradCheckCase{"scaled_dot_product_attention/bthd",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "layout" value { s: "bthd" } })pb",
                  {Qkv("q", {2, 5, 3, 2}), Qkv("k", {2, 5, 3, 2}), Qkv("v", {2, 5, 3, 2})}},
    GradCheckCase{"scaled_dot_product_attention/bthd_not_causal_scale",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "layout" value { s: "bthd" } }
                       attr { key: "causal" value { b: false } }
                       attr { key: "scale" value { f: 0.7 } })pb",
                  {Qkv("q", {2, 5, 3, 2}), Qkv("k", {2, 5, 3, 2}), Qkv("v", {2, 5, 3, 2})}},
    GradCheckCase{"scaled_dot_product_attention/bthd_two_row_blocks",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "layout" value { s: "bthd" } })pb",
                  {Qkv("q", {1, 70, 2, 2}), Qkv("k", {1, 70, 2, 2}), Qkv("v", {1, 70, 2, 2})}},
    GradCheckCase{"scaled_dot_product_attention/bthd_lse_only",
                  R"pb(type: "scaled_dot_product_attention" input: ["q", "k", "v"] output: ["y", "lse"]
                       attr { key: "layout" value { s: "bthd" } })pb",
                  {Qkv("q", {2, 4, 3, 2}), Qkv("k", {2, 4, 3, 2}), Qkv("v", {2, 4, 3, 2})},
                  1e-6,
                  /*outputs_without_grad=*/{0}},
    // The packed form, qkv [B, T, 3, H, D]: causal and not, two row blocks,
    // each output alone.
    GradCheckCase{"scaled_dot_product_attention_qkv/causal",
                  R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"] output: ["y", "lse"])pb",
                  {Qkv("qkv", {2, 5, 3, 3, 2})}},
    GradCheckCase{"scaled_dot_product_attention_qkv/not_causal_scale",
                  R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"] output: ["y", "lse"]
                       attr { key: "causal" value { b: false } }
                       attr { key: "scale" value { f: 0.7 } })pb",
                  {Qkv("qkv", {2, 5, 3, 3, 2})}},
    GradCheckCase{"scaled_dot_product_attention_qkv/two_row_blocks",
                  R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"] output: ["y", "lse"])pb",
                  {Qkv("qkv", {1, 70, 3, 2, 2})}},
    GradCheckCase{"scaled_dot_product_attention_qkv/y_only",
                  R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"] output: ["y", "lse"])pb",
                  {Qkv("qkv", {2, 4, 3, 3, 2})},
                  1e-6,
                  /*outputs_without_grad=*/{1}},
    GradCheckCase{"scaled_dot_product_attention_qkv/lse_only",
                  R"pb(type: "scaled_dot_product_attention_qkv" input: ["qkv"] output: ["y", "lse"])pb",
                  {Qkv("qkv", {2, 4, 3, 3, 2})},
                  1e-6,
                  /*outputs_without_grad=*/{0}},
});

}  // namespace
}  // namespace strata
