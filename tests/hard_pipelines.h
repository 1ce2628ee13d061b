#ifndef STRATA_TESTS_HARD_PIPELINES_H_
#define STRATA_TESTS_HARD_PIPELINES_H_

// Programs whose pipeline splits are hard to get right, shared by the
// pipeline parity tests (on Gloo) and the device collectives tests (over a
// fake NCCL, which matches a pair's messages by issue order as NCCL does).

namespace strata {

// Gradients passed through an add on one stage but made on a later one:
// W = P + Q on stage 0 is read on stage 1, so dW is made on stage 1 and the
// parameters' gradients must come back to stage 0; P + P on stage 1 read on
// stage 2, with P also read on stage 0 (a tied weight) and clipping, must be
// counted once in the global norm. (Sharing dW as P's gradient on stage 1
// lost the first to the split and the second to the norm, found in review.)
inline constexpr char kPassThroughAcrossStages[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "A" dtype: F64 shape: [8, 8] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
  var { name: "P" dtype: F64 shape: [8, 4] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
  var { name: "Q" dtype: F64 shape: [8, 4] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
  var { name: "T" dtype: F64 shape: [8, 4] kind: PARAM init { uniform { low: -0.3 high: 0.3 } } }
  var { name: "C" dtype: F64 shape: [4, 10] kind: PARAM init { uniform { low: -0.5 high: 0.5 } } }
  op { type: "matmul" input: ["x", "A"] output: ["h0"] device: "gpu:0" }
  op { type: "relu" input: ["h0"] output: ["h"] device: "gpu:0" }
  op { type: "add" input: ["P", "Q"] output: ["W"] device: "gpu:0" }
  op { type: "reduce_mean" input: ["T"] output: ["t_mean"] device: "gpu:0" }
  op { type: "matmul" input: ["h", "W"] output: ["y1"] device: "gpu:1" }
  op { type: "add" input: ["T", "T"] output: ["T2"] device: "gpu:1" }
  op { type: "matmul" input: ["h", "T2"] output: ["y2"] device: "gpu:2" }
  op { type: "add" input: ["y1", "y2"] output: ["y"] device: "gpu:2" }
  op { type: "matmul" input: ["y", "C"] output: ["logits"] device: "gpu:2" }
  op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:2" }
  loss: "loss"
  fetch: "t_mean"
  optimizer { sgd { learning_rate: 0.5 } clip_global_norm: 0.05 }
)pb";

// Two weights each read on the first and the last stage, and a third on the
// middle and the last (its home a middle stage): each replica sends its
// parts and takes the sums back once a step. The last stage makes B's part
// before A's and the first sums A before B: the receives, posted in the
// order they were read, went in another order than the sends, which NCCL,
// matching a pair's messages by issue order, would have swapped; an action
// posts its receives in channel order now, the order of the sends.
inline constexpr char kThreeTiedWeights[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "A" dtype: F64 shape: [8, 8] kind: PARAM init { uniform { low: -0.4 high: 0.4 } } }
  var { name: "B" dtype: F64 shape: [8, 8] kind: PARAM init { uniform { low: -0.4 high: 0.4 } } }
  var { name: "M" dtype: F64 shape: [8, 8] kind: PARAM init { uniform { low: -0.4 high: 0.4 } } }
  var { name: "C" dtype: F64 shape: [8, 10] kind: PARAM init { uniform { low: -0.5 high: 0.5 } } }
  op { type: "matmul" input: ["x", "A"] output: ["a0"] device: "gpu:0" }
  op { type: "tanh" input: ["a0"] output: ["a1"] device: "gpu:0" }
  op { type: "matmul" input: ["a1", "B"] output: ["b0"] device: "gpu:0" }
  op { type: "tanh" input: ["b0"] output: ["b1"] device: "gpu:0" }
  op { type: "matmul" input: ["b1", "M"] output: ["m0"] device: "gpu:1" }
  op { type: "tanh" input: ["m0"] output: ["m1"] device: "gpu:1" }
  op { type: "matmul" input: ["m1", "A"] output: ["c0"] device: "gpu:2" }
  op { type: "tanh" input: ["c0"] output: ["c1"] device: "gpu:2" }
  op { type: "matmul" input: ["c1", "B"] output: ["d0"] device: "gpu:2" }
  op { type: "tanh" input: ["d0"] output: ["d1"] device: "gpu:2" }
  op { type: "matmul" input: ["d1", "M"] output: ["e0"] device: "gpu:2" }
  op { type: "matmul" input: ["e0", "C"] output: ["logits"] device: "gpu:2" }
  op { type: "softmax_cross_entropy" input: ["logits", "label"] output: ["loss"] device: "gpu:2" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.2 } }
)pb";

// Two tied weights whose homes cross: A is read first on stage 0, B first
// on stage 1, each read on the other stage too. Each stage is the home of
// one and a replica of the other, so each sends a part and receives a part
// in the optimizer action (a replica's part sent after its backward, after
// its own sums, waited there for the other's part: the stages hung, found
// in review).
inline constexpr char kCrossedTiedWeights[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "A" dtype: F64 shape: [8, 8] kind: PARAM init { normal { std: 0.3 } } }
  var { name: "B" dtype: F64 shape: [8, 8] kind: PARAM init { normal { std: 0.3 } } }
  var { name: "w2" dtype: F64 shape: [8, 10] kind: PARAM init { normal { std: 0.3 } } }
  op { type: "matmul" input: ["x", "A"] output: ["h0"] device: "gpu:0" }
  op { type: "matmul" input: ["h0", "B"] output: ["h1"] device: "gpu:1" }
  op { type: "matmul" input: ["x", "B"] output: ["k"] device: "gpu:0" }
  op { type: "add" input: ["h1", "k"] output: ["h2"] device: "gpu:1" }
  op { type: "matmul" input: ["h2", "A"] output: ["h3"] device: "gpu:1" }
  op { type: "matmul" input: ["h3", "w2"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

// A weight read on two stages whose gradient has one path (stage 0 only
// reports its mean): no sum of parts from autodiff, the last stage's matmul
// gradient is all of it; the pipeline split gives it a sum of one part (a
// copy) in the optimizer action, sent to stage 0's replica once an update.
// (Sent from the buffer the micro-batches sum it into, the buffer was
// zeroed for the next step while the send was in flight, and the replicas
// parted.)
inline constexpr char kOnePathTiedWeight[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "W" dtype: F64 shape: [8, 8] kind: PARAM init { normal { std: 0.3 } } }
  var { name: "T" dtype: F64 shape: [8, 10] kind: PARAM init { normal { std: 0.3 } } }
  op { type: "matmul" input: ["x", "W"] output: ["h0"] device: "gpu:0" }
  op { type: "tanh" input: ["h0"] output: ["h"] device: "gpu:0" }
  op { type: "reduce_mean" input: ["T"] output: ["t_mean"] device: "gpu:0" }
  op { type: "matmul" input: ["h", "T"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  fetch: "t_mean"
  optimizer { sgd { learning_rate: 0.2 } }
)pb";

// The same with the one gradient path on the first stage (T is read on
// stage 1 only for a fetched mean): the gradient goes the way the
// activations go. Sent in every backward, it met stage 0's next forward's
// activation on the same pair of ranks, which a GPU plan (NCCL matching by
// issue order) refused; once an update it does not.
inline constexpr char kOnePathTiedWeightOnTheFirstStage[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "T" dtype: F64 shape: [8, 8] kind: PARAM init { normal { std: 0.3 } } }
  var { name: "C" dtype: F64 shape: [8, 10] kind: PARAM init { normal { std: 0.3 } } }
  op { type: "matmul" input: ["x", "T"] output: ["h0"] device: "gpu:0" }
  op { type: "tanh" input: ["h0"] output: ["h"] device: "gpu:0" }
  op { type: "reduce_mean" input: ["T"] output: ["t_mean"] device: "gpu:1" }
  op { type: "matmul" input: ["h", "C"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  fetch: "t_mean"
  optimizer { sgd { learning_rate: 0.2 } }
)pb";

// Two weights read on stage 0 only for fetched means and summed on stage 1:
// autodiff gives both one gradient var (u's), so the pipeline split must
// give it one sum and stage 0 receive it once (twice, the schedule hung;
// the second sum read a part nothing wrote; found in review).
inline constexpr char kTwoTiedWeightsSharingOneGradient[] = R"pb(
  var { name: "x" dtype: F64 shape: [-1, 8] kind: FEED }
  var { name: "label" dtype: I64 shape: [-1] kind: FEED }
  var { name: "W" dtype: F64 shape: [8, 8] kind: PARAM init { normal { std: 0.3 } } }
  var { name: "T" dtype: F64 shape: [8, 10] kind: PARAM init { normal { std: 0.3 } } }
  var { name: "T2" dtype: F64 shape: [8, 10] kind: PARAM init { normal { std: 0.3 } } }
  op { type: "matmul" input: ["x", "W"] output: ["h0"] device: "gpu:0" }
  op { type: "tanh" input: ["h0"] output: ["h"] device: "gpu:0" }
  op { type: "reduce_mean" input: ["T"] output: ["t_mean"] device: "gpu:0" }
  op { type: "reduce_mean" input: ["T2"] output: ["t2_mean"] device: "gpu:0" }
  op { type: "add" input: ["T", "T2"] output: ["u"] device: "gpu:1" }
  op { type: "matmul" input: ["h", "u"] output: ["z"] device: "gpu:1" }
  op { type: "softmax_cross_entropy" input: ["z", "label"] output: ["loss"] device: "gpu:1" }
  loss: "loss"
  fetch: "t_mean"
  fetch: "t2_mean"
  optimizer { sgd { learning_rate: 0.2 } }
)pb";

}  // namespace strata

#endif  // STRATA_TESTS_HARD_PIPELINES_H_
