// Pipeline family: point-to-point transfers between stages and the buffers
// that accumulate gradients over micro-batches. Appended by the compiler's
// pipeline passes; users do not write them.
//
// send/recv carry a typed Channel on the op (source rank, destination rank,
// var, id) decided at compile time, and the recv's type is an attr, so no
// shape is discovered at run time and nothing is matched by program order.

#include <string>

#include "absl/strings/str_cat.h"
#include "compiler/op_registry.h"

namespace strata {
namespace {

absl::StatusOr<DataType> ParseDtypeAttr(const std::string& s) {
  DataType dtype;
  if (!DataType_Parse(s, &dtype) || dtype == DT_INVALID) {
    return absl::InvalidArgumentError(absl::StrCat("attr 'dtype' must be F32, F64, I64, I32, BOOL, BF16 or F16, got '", s, "'"));
  }
  return dtype;
}

absl::Status RecvShape(ShapeContext& ctx) {
  auto dtype = ParseDtypeAttr(ctx.attr_string("dtype"));
  if (!dtype.ok()) return dtype.status();
  std::vector<int64_t> shape = ctx.attr_ints("shape");
  int batch = 0;
  for (int64_t d : shape) {
    if (d == -1) ++batch;
    else if (d <= 0) return absl::InvalidArgumentError(absl::StrCat("attr 'shape' has a non-positive dim ", d));
  }
  if (batch > 1) return absl::InvalidArgumentError("attr 'shape' has more than one batch dim (-1)");
  ctx.set_output(0, TensorType{*dtype, Shape(shape.begin(), shape.end())});
  return absl::OkStatus();
}

absl::Status AccumulateShape(ShapeContext& ctx) {
  if (ctx.input(0) != ctx.input(1)) {
    return absl::InvalidArgumentError(absl::StrCat("accumulator ", ctx.input(0).ToString(), " and value ",
                                                   ctx.input(1).ToString(), " differ"));
  }
  ctx.set_output(0, ctx.input(0));
  return absl::OkStatus();
}

// bucket_allreduce(bucket, grads...) -> bucket: the bucket holds every
// gradient's elements, in order, in their common floating dtype.
absl::Status BucketAllReduceShape(ShapeContext& ctx) {
  const TensorType& bucket = ctx.input(0);
  if (!IsFloating(bucket.dtype) || bucket.shape.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat("bucket must be a floating vector, got ", bucket.ToString()));
  }
  int64_t elements = 0;
  for (int i = 1; i < ctx.num_inputs(); ++i) {
    const TensorType& g = ctx.input(i);
    if (g.dtype != bucket.dtype) {
      return absl::InvalidArgumentError(absl::StrCat("gradient ", ctx.input_role(i), " is ", g.ToString(),
                                                     ", the bucket ", DataTypeName(bucket.dtype)));
    }
    int64_t n = 1;
    for (int64_t d : g.shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("gradient ", ctx.input_role(i), " has a batch dim"));
      n *= d;
    }
    elements += n;
  }
  if (elements != bucket.shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat("the gradients hold ", elements, " elements, the bucket ",
                                                   bucket.shape[0]));
  }
  ctx.set_output(0, bucket);
  return absl::OkStatus();
}

// bucket_wait(bucket) -> grads...: attr `shapes` lists each output's rank,
// then its dims ([2, 784, 256, 1, 256] for a [784, 256] and a [256]).
absl::Status BucketWaitShape(ShapeContext& ctx) {
  const TensorType& bucket = ctx.input(0);
  const std::vector<int64_t> shapes = ctx.attr_ints("shapes");
  size_t at = 0;
  int64_t elements = 0;
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    if (at >= shapes.size() || shapes[at] < 0 || at + 1 + shapes[at] > shapes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("attr 'shapes' does not describe output ", i));
    }
    Shape shape(shapes.begin() + at + 1, shapes.begin() + at + 1 + shapes[at]);
    at += 1 + shapes[at];
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0) return absl::InvalidArgumentError(absl::StrCat("attr 'shapes' has a negative dim for output ", i));
      n *= d;
    }
    elements += n;
    ctx.set_output(i, TensorType{bucket.dtype, std::move(shape)});
  }
  if (at != shapes.size()) return absl::InvalidArgumentError("attr 'shapes' describes more tensors than the op outputs");
  if (bucket.shape.size() != 1 || elements != bucket.shape[0]) {
    return absl::InvalidArgumentError(absl::StrCat("the outputs hold ", elements, " elements, the bucket is ",
                                                   bucket.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

STRATA_REGISTER_OP(OpDef("send").Input("x")
    .CompilerOnly()
    .Shape([](ShapeContext&) { return absl::OkStatus(); })
    .Doc("Posts x to the channel's destination rank; completes asynchronously."));

STRATA_REGISTER_OP(OpDef("recv").Output("y")
    .CompilerOnly()
    .Attr("shape", AttrType::kInts).Attr("dtype", AttrType::kString)
    .Shape(RecvShape)
    .Doc("Receives the channel's var from its source rank; -1 in shape is the micro-batch size."));

STRATA_REGISTER_OP(OpDef("allreduce").Input("x").Output("y")
    .CompilerOnly()
    .Attr("op", "sum")
    .Shape([](ShapeContext& ctx) -> absl::Status {
      if (ctx.attr_string("op") != "sum") {
        return absl::InvalidArgumentError(absl::StrCat("attr 'op' must be \"sum\", got '", ctx.attr_string("op"), "'"));
      }
      for (int64_t d : ctx.input(0).shape) {
        if (d < 0) return absl::InvalidArgumentError("allreduce needs a static shape (no batch dimension)");
      }
      ctx.set_output(0, ctx.input(0));
      return absl::OkStatus();
    })
    .Doc("Sums x over the ranks of the op's communication group (Op.group, an id of the plan's "
         "Topology.group; none: the world)."));

STRATA_REGISTER_OP(OpDef("bucket_allreduce").Input("bucket").VariadicInput("grads").Output("bucket")
    .CompilerOnly()
    .Attr("bucket", int64_t{0})
    .Stateful()
    .OncePerUpdate()
    .Shape(BucketAllReduceShape)
    .Doc("Data parallel: copies the gradients into the bucket and starts summing it over the op's group "
         "(Op.group) asynchronously; bucket_wait with the same `bucket` id finishes it. Acts once per "
         "optimizer update, in the backward of the step's last micro-batch."));

STRATA_REGISTER_OP(OpDef("bucket_wait").Input("bucket").VariadicOutput("grads")
    .CompilerOnly()
    .Attr("bucket", int64_t{0}).Attr("shapes", AttrType::kInts)
    .Shape(BucketWaitShape)
    .Doc("Waits for bucket_allreduce `bucket` and copies the summed gradients out of it; attr `shapes` "
         "gives each output's rank, then its dims."));

// Host <-> device copies, placed by the host-transfers pass on plans for an
// accelerator, so that no tensor crosses between host and device memory
// except through an op the program shows.
STRATA_REGISTER_OP(OpDef("copy_to_device").Input("x").Output("y")
    .CompilerOnly()
    .Shape(SameAsInput(0))
    .NotDifferentiable()
    .Doc("y = x, copied from host memory (x is a host_memory var: a feed as the data loader hands it "
         "over) into the device's, ordered on the compute stream."));

STRATA_REGISTER_OP(OpDef("copy_to_host").Input("x").Output("y")
    .CompilerOnly()
    .Shape(SameAsInput(0))
    .NotDifferentiable()
    .Doc("y = x, copied from the device into host memory (y is a host_memory var, page-locked on a "
         "GPU) without waiting: the bytes are there once the step's work has finished, when the "
         "executor reads the loss and fetches from them."));

STRATA_REGISTER_OP(OpDef("accumulate").Input("acc").Input("x").Output("acc").Stateful()
    .Shape(AccumulateShape)
    .Doc("acc += x, in place (gradients summed over micro-batches)."));

STRATA_REGISTER_OP(OpDef("fill_zero").Input("x").Output("x").Stateful()
    .Shape(SameAsInput(0))
    .Doc("x = 0, in place (gradient buffers after the optimizer has read them)."));

}  // namespace strata
