// add_n, fill_scalar, fill_like and identity.
// Threads: add_n splits the flat element range into contiguous chunks, each
// summing all inputs before moving on (one pass over the output per chunk).

#include <algorithm>

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/widened.h"
#include "kernels/kernel_checks.h"
#include "kernels/view_kernels.h"

namespace strata {
namespace {

template <typename T>
class AddNKernel : public OpKernel {
 public:
  explicit AddNKernel(const KernelDef&) {}
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& first = ctx.input(0);
    const int inputs = ctx.num_inputs();
    if (absl::Status s = kernel_checks::CheckAddNShapes(ctx); !s.ok()) return s;
    // A tensor of its own even for one input (a copy), as the memory plan
    // counts it and the CUDA kernel writes it: the pipeline's sum of a tied
    // gradient's one part is sent while its input, the micro-batches'
    // buffer, is zeroed for the next step.
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, DataTypeOf<T>::value, first.shape());
    if (!y.ok()) return y.status();
    T* out = (*y)->data<T>();
    ParallelFor(first.num_elements(), kElementwiseMinChunk / inputs, [&](int64_t begin, int64_t end) {
      const T* a = ctx.input(0).data<T>();
      if (inputs == 1) {
        std::copy(a + begin, a + end, out + begin);
        return;
      }
      const T* b = ctx.input(1).data<T>();
      for (int64_t j = begin; j < end; ++j) out[j] = a[j] + b[j];
      for (int i = 2; i < inputs; ++i) {
        const T* c = ctx.input(i).data<T>();
        for (int64_t j = begin; j < end; ++j) out[j] += c[j];
      }
    });
    return absl::OkStatus();
  }
};

class FillLikeKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const KernelDef& def) {
    absl::StatusOr<double> value = AttrFloat(*def.op, "value");
    if (!value.ok()) return value.status();
    return std::unique_ptr<OpKernel>(new FillLikeKernel(*value));
  }
  absl::Status Compute(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, x.dtype(), x.shape());
    if (!y.ok()) return y.status();
    (*y)->Fill(value_);
    return absl::OkStatus();
  }

 private:
  explicit FillLikeKernel(double value) : value_(value) {}
  double value_;
};

class FillScalarKernel : public OpKernel {
 public:
  static absl::StatusOr<std::unique_ptr<OpKernel>> Create(const KernelDef& def) {
    absl::StatusOr<double> value = AttrFloat(*def.op, "value");
    if (!value.ok()) return value.status();
    absl::StatusOr<DataType> dtype = kernel_checks::FillScalarDtype(def);
    if (!dtype.ok()) return dtype.status();
    return std::unique_ptr<OpKernel>(new FillScalarKernel(*dtype, *value));
  }
  absl::Status Compute(KernelContext& ctx) override {
    absl::StatusOr<Tensor*> y = ctx.AllocateOutput(0, dtype_, {});
    if (!y.ok()) return y.status();
    (*y)->Fill(value_);
    return absl::OkStatus();
  }

 private:
  FillScalarKernel(DataType dtype, double value) : dtype_(dtype), value_(value) {}
  DataType dtype_;
  double value_;
};

STRATA_REGISTER_KERNEL("add_n", DEVICE_CPU, F32, (MakeFactory<AddNKernel<float>>()));
STRATA_REGISTER_KERNEL("add_n", DEVICE_CPU, F64, (MakeFactory<AddNKernel<double>>()));
STRATA_REGISTER_KERNEL("add_n", DEVICE_CPU, I64, (MakeFactory<AddNKernel<int64_t>>()));
// BF16 and F16 (mixed precision: autodiff sums the gradient parts of a
// low-precision copy read twice, a weight's cast shared by two matmuls).
STRATA_REGISTER_KERNEL("add_n", DEVICE_CPU, BF16, (MakeFactory<WidenedKernel<bfloat16, AddNKernel<float>>>()));
STRATA_REGISTER_KERNEL("add_n", DEVICE_CPU, F16, (MakeFactory<WidenedKernel<float16, AddNKernel<float>>>()));
STRATA_REGISTER_WORKSPACE("add_n", DEVICE_CPU, WidenedWorkspace);
STRATA_REGISTER_KERNEL("fill_scalar", DEVICE_CPU, F32, FillScalarKernel::Create);
STRATA_REGISTER_KERNEL("fill_scalar", DEVICE_CPU, F64, FillScalarKernel::Create);
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CPU, F32, FillLikeKernel::Create);
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CPU, F64, FillLikeKernel::Create);
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CPU, I64, FillLikeKernel::Create);
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CPU, I32, FillLikeKernel::Create);
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CPU, BOOL, FillLikeKernel::Create);
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CPU, BF16, FillLikeKernel::Create);
STRATA_REGISTER_KERNEL("fill_like", DEVICE_CPU, F16, FillLikeKernel::Create);
STRATA_REGISTER_KERNEL("identity", DEVICE_CPU, F32, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CPU, F64, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CPU, I64, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CPU, I32, MakeFactory<view_kernels::IdentityKernel>());
STRATA_REGISTER_KERNEL("identity", DEVICE_CPU, BOOL, MakeFactory<view_kernels::IdentityKernel>());

}  // namespace
}  // namespace strata
