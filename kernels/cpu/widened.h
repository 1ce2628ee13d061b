#ifndef STRATA_KERNELS_CPU_WIDENED_H_
#define STRATA_KERNELS_CPU_WIDENED_H_

// BF16 and F16 on the CPU: storage only (DESIGN.md, mixed precision), the
// math in float32. A widened kernel converts its low-precision inputs to
// float32 scratch (inputs of any other dtype, such as attention's F32 lse,
// go to the inner kernel as they are), runs the op's float32 kernel on them
// and rounds the outputs planned in the low dtype back to nearest even, as
// PyTorch's CPU autocast does for bf16 matmul; outputs planned as F32 (such
// as attention's lse) are copied through unrounded. WidenedWorkspace tells
// the memory plan what the scratch costs.

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/nn_kernel_util.h"
#include "proto/status_macros.h"
#include "runtime/float16.h"
#include "runtime/kernel.h"

namespace strata {

template <typename Half>
constexpr DataType HalfDtype() {
  return std::is_same_v<Half, bfloat16> ? BF16 : F16;
}

// A 16-bit tensor's float copy in the kernel's scratch (flat), converted on
// the thread pool.
template <typename Half>
absl::StatusOr<Tensor> WidenToScratch(const KernelContext& ctx, const Tensor& t) {
  STRATA_ASSIGN_OR_RETURN(Tensor wide, nn_kernels::Scratch(ctx, F32, t.num_elements()));
  UnaryMap(t.num_elements(), t.data<Half>(), wide.data<float>(), [](Half h) { return ToFloat(h); });
  return wide;
}

// `Inner` is the float32 kernel class of the same op. With kWidenInputs
// false, Inner reads the 16-bit inputs as they are (oneDNN's bf16 GEMMs,
// matmul.cc) and only its float outputs are rounded here.
template <typename Half, typename Inner, bool kWidenInputs = true>
class WidenedKernel : public OpKernel {
 public:
  explicit WidenedKernel(const KernelDef& def) {
    if constexpr (std::is_constructible_v<Inner, const KernelDef&>) {
      inner_ = std::make_unique<Inner>(def);
    } else {
      inner_ = std::make_unique<Inner>();
    }
    out_dtypes_.reserve(def.output_types.size());
    for (const TensorType& t : def.output_types) out_dtypes_.push_back(t.dtype);
  }
  absl::Status Init(const Op& op) { return inner_->Init(op); }

  absl::Status Compute(KernelContext& ctx) override {
    std::vector<Tensor> wide(ctx.num_inputs());
    std::vector<const Tensor*> inputs(ctx.num_inputs());
    for (int i = 0; i < ctx.num_inputs(); ++i) {
      const Tensor& t = ctx.input(i);
      inputs[i] = &t;
      if (!kWidenInputs || t.dtype() != HalfDtype<Half>()) continue;
      STRATA_ASSIGN_OR_RETURN(wide[i], WidenToScratch<Half>(ctx, t));
      wide[i] = wide[i].Reshaped(t.shape());
      inputs[i] = &wide[i];
    }
    std::vector<Tensor> outputs(ctx.num_outputs());
    KernelContext inner(&ctx.run(), inputs, absl::MakeSpan(outputs));
    STRATA_RETURN_IF_ERROR(inner_->Compute(inner));
    wide.clear();  // the float32 inputs go before the outputs are rounded
    for (int i = 0; i < ctx.num_outputs(); ++i) {
      const Tensor& y = outputs[i];
      if (y.dtype() != F32) {
        return absl::InternalError(absl::StrCat("widened ", DataTypeName(HalfDtype<Half>()),
                                                " kernel: the float32 kernel's output ", i, " is ",
                                                DataTypeName(y.dtype()), ", expected F32"));
      }
      const DataType planned = OutputDtype(i);
      if (planned == F32) {
        STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(i, F32, y.shape()));
        UnaryMap(y.num_elements(), y.data<float>(), out->data<float>(), [](float v) { return v; });
        continue;
      }
      if (planned != HalfDtype<Half>()) {
        return absl::InternalError(absl::StrCat("widened ", DataTypeName(HalfDtype<Half>()), " kernel: output ", i,
                                                " is planned as ", DataTypeName(planned), ", expected ",
                                                DataTypeName(HalfDtype<Half>()), " or F32"));
      }
      STRATA_ASSIGN_OR_RETURN(Tensor * out, ctx.AllocateOutput(i, HalfDtype<Half>(), y.shape()));
      const float* src = y.data<float>();
      Half* dst = out->data<Half>();
      UnaryMap(y.num_elements(), src, dst, [](float v) { return FromFloat(v); });
    }
    return absl::OkStatus();
  }

 private:
  // Output i's planned dtype. A kernel built without output types (run
  // directly, as some tests do) rounds every output to the low dtype: right
  // for the ops whose outputs all have their inputs' type (matmul, add_n),
  // not for attention's F32 lse, whose callers must plan the types.
  DataType OutputDtype(int i) const {
    return out_dtypes_.empty() ? HalfDtype<Half>() : out_dtypes_.at(static_cast<size_t>(i));
  }
  static Half FromFloat(float f) {
    if constexpr (std::is_same_v<Half, bfloat16>) {
      return ToBfloat16(f);
    } else {
      return ToFloat16(f);
    }
  }
  std::unique_ptr<Inner> inner_;
  std::vector<DataType> out_dtypes_;  // def.output_types' dtypes; empty when unplanned
};

// What a widened kernel holds on top of its planned outputs, which the
// memory plan counts from the op's start (it adds the workspace to them).
// While the float32 kernel runs: the float32 copies of the 16-bit inputs,
// the float32 outputs and that kernel's own scratch (`inner`); after it, the
// float32 outputs beside the planned outputs they are rounded into (the
// float32 inputs and the scratch are freed first). So the larger of the two
// phases less the planned outputs: counting both copies beside the outputs
// over-predicted a BF16 matmul head by 14% (the memory rule allows 10%).
// widen_inputs false: a WidenedKernel that reads its 16-bit inputs as they
// are (no float copies of them).
inline absl::StatusOr<int64_t> WidenedWorkspaceOver(const KernelDef& def, int64_t inner, bool widen_inputs = true) {
  int64_t wide_in = 0;
  bool half = false;
  for (const TensorType& t : def.input_types) {
    if (!IsHalfFloating(t.dtype)) continue;
    half = true;
    if (widen_inputs) wide_in += NumElements(t.shape) * static_cast<int64_t>(sizeof(float));
  }
  if (!half) return inner;
  int64_t wide_out = 0, planned_out = 0;
  for (const TensorType& t : def.output_types) {
    wide_out += NumElements(t.shape) * static_cast<int64_t>(sizeof(float));
    planned_out += NumElements(t.shape) * static_cast<int64_t>(DataTypeSize(t.dtype));
  }
  return std::max(wide_in + wide_out + inner - planned_out, wide_out);
}

// The same for a float32 kernel without scratch of its own.
inline absl::StatusOr<int64_t> WidenedWorkspace(const KernelDef& def, int) { return WidenedWorkspaceOver(def, 0); }

}  // namespace strata

#endif  // STRATA_KERNELS_CPU_WIDENED_H_
