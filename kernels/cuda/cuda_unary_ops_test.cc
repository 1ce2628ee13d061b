// The CUDA kernels of the elementwise unary ops, their gradients, scale,
// add_n, cast, accumulate, fill_zero, fill_scalar, identity and the views
// reshape, flatten and reshape_like (kernels/cuda/cuda_unary_ops.cc) against
// the CPU kernels. Tagged gpu: without a CUDA device every test FAILS.
//
// Bars: bit for bit wherever both sides do the same IEEE operations in the
// same order (nvcc builds the kernels with --fmad=false, and both sides run
// unary_math.h's functors). The transcendentals (exp, log, tanh, erf) are
// each side's own library: CUDA's documented maximum errors (CUDA C++
// Programming Guide, "Mathematical Functions": expf 2 ulp, logf 1, tanhf 2,
// erff 2; exp 1, log 1, tanh 2, erf 2) and glibc's for x86_64
// (libm-test-ulps: 1 ulp for exp, log and erf, 2 for tanh, in float and
// double). Two results within kc and kg ulp of the exact value differ by at
// most (kc + kg) ulp <= (kc + kg) * eps * max(|cpu|, |gpu|), eps = 2^-23 in
// F32 and 2^-52 in F64; the composite ops (gelu, sigmoid, gelu_grad) carry
// that difference through their arithmetic, with the bound derived per
// element below.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_op_test_util.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/kernel.h"
#include "runtime/tensor.h"

namespace strata {
namespace {

using testing::BitEqual;
using testing::CudaOpsTest;
using testing::Integers;
using testing::RandomTensor;
using testing::RunKernel;
using testing::Uniform;

STRATA_CUDA_OPS_TESTED(cuda_unary_ops_test, {
                                                {"exp", {F32, F64}},
                                                {"log", {F32, F64}},
                                                {"neg", {F32, F64}},
                                                {"scale", {F32, F64}},
                                                {"sqrt", {F32, F64}},
                                                {"sqrt_grad", {F32, F64}},
                                                {"square", {F32, F64}},
                                                {"gelu", {F32, F64, BF16, F16}},
                                                {"gelu_grad", {F32, F64, BF16, F16}},
                                                {"sigmoid", {F32, F64}},
                                                {"sigmoid_grad", {F32, F64}},
                                                {"tanh", {F32, F64}},
                                                {"tanh_grad", {F32, F64}},
                                                {"add_n", {F32, F64, I64, BF16, F16}},
                                                {"fill_scalar", {F32, F64}},
                                                {"identity", {F32, F64, I64, I32, BOOL}},
                                                {"accumulate", {F32, F64}},
                                                {"fill_zero", {F32, F64}},
                                                {"cast", {F32, F64, I64, I32, BOOL, BF16, F16}},
                                                {"reshape", {F32, F64, I64, BF16, F16}},
                                                {"reshape_like", {F32, F64, I64, BF16, F16}},
                                                {"flatten", {F32, F64, I64, BF16, F16}},
                                            });

// Shapes for every elementwise op: rank 0, empty, odd sizes.
const std::vector<Shape>& ElementwiseShapes() {
  static const auto* shapes = new std::vector<Shape>{{}, {0}, {3, 0}, {1}, {37, 29}, {2, 3, 5, 7}};
  return *shapes;
}

// More elements than one pass of the grid (65536 blocks x 256 threads).
const Shape kBig{4100, 4100};

double Eps(DataType dtype) { return dtype == F32 ? 0x1p-23 : 0x1p-52; }

std::vector<double> Scaled(std::vector<double> v, double by) {
  for (double& x : v) x *= by;
  return v;
}
std::vector<double> Abs(std::vector<double> v) {
  for (double& x : v) x = std::abs(x);
  return v;
}

// Same dtype and shape; per element the same bits, or both NaN (IEEE leaves
// NaN payloads and signs open: x86 gives -nan where CUDA gives its canonical
// 0x7fffffff, and PTX's cvt between f32 and f64 does not keep payloads).
::testing::AssertionResult SameBitsOrBothNan(const Tensor& gpu, const Tensor& cpu) {
  if (gpu.dtype() != cpu.dtype() || gpu.shape() != cpu.shape()) {
    return ::testing::AssertionFailure() << TypeOf(gpu).ToString() << " vs " << TypeOf(cpu).ToString();
  }
  const std::vector<double> g = TensorValues(gpu), c = TensorValues(cpu);
  const size_t size = DataTypeSize(gpu.dtype());
  const auto* gb = static_cast<const char*>(gpu.raw_data());
  const auto* cb = static_cast<const char*>(cpu.raw_data());
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) && std::isnan(c[i])) continue;
    if (std::memcmp(gb + i * size, cb + i * size, size) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": gpu " << g[i] << " cpu " << c[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// Per element: both NaN, or |gpu - cpu| <= bar(i, cpu, gpu).
void ExpectWithin(const Tensor& gpu, const Tensor& cpu, const std::function<double(size_t, double, double)>& bar) {
  ASSERT_EQ(gpu.dtype(), cpu.dtype());
  ASSERT_EQ(gpu.shape(), cpu.shape());
  const std::vector<double> g = TensorValues(gpu), c = TensorValues(cpu);
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 5; ++i) {
    if (std::isnan(g[i]) && std::isnan(c[i])) continue;
    const double b = bar(i, c[i], g[i]);
    if (!(std::abs(g[i] - c[i]) <= b)) {
      ADD_FAILURE() << "element " << i << ": gpu " << g[i] << " cpu " << c[i] << " bar " << b;
      ++bad;
    }
  }
}

// Plain strings: clang-format reformats R"pb(...)pb" fragments as text protos.
std::string UnaryOpText(const std::string& op) {
  return absl::StrCat("type: \"", op, "\" input: \"x\" output: \"y\"");
}
std::string GradOpText(const std::string& op) {
  return absl::StrCat("type: \"", op, "\" input: [ \"a\", \"dy\" ] output: \"y\"");
}
std::string ScaleOpText(double scale, double bias) {
  return absl::StrCat(R"pb(type: "scale"
                           input: "x"
                           output: "y"
                           attr { key: "scale"
                                  value { f:)pb",
                      scale, R"pb(}
                                  } attr { key: "bias" value { f: )pb",
                      bias, " } }");
}

// neg, square, sqrt and scale are one or two IEEE operations: bit for bit.
TEST_F(CudaOpsTest, ArithmeticUnaryOpsEqualTheCpuBitForBit) {
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const std::vector<double> v = Scaled(Uniform(NumElements(shape), 31), 50);
      const Tensor x = MakeTensor(dtype, shape, v), positive = MakeTensor(dtype, shape, Abs(v));
      for (const char* op : {"neg", "square"}) {
        auto [cpu, gpu] = RunBoth(UnaryOpText(op), {{"x", x}});
        EXPECT_TRUE(BitEqual(gpu, cpu)) << op;
      }
      auto [sqrt_cpu, sqrt_gpu] = RunBoth(UnaryOpText("sqrt"), {{"x", positive}});
      EXPECT_TRUE(BitEqual(sqrt_gpu, sqrt_cpu)) << "sqrt";
      for (auto [scale, bias] : {std::pair{1.7, -0.3}, std::pair{-3.0, 0.0}, std::pair{0.1, 1e-3}}) {
        auto [cpu, gpu] = RunBoth(ScaleOpText(scale, bias), {{"x", x}});
        EXPECT_TRUE(BitEqual(gpu, cpu)) << "scale " << scale << " bias " << bias;
      }
    }
  }
}

// Outside the domain both sides give NaN (sqrt and log of negatives, gelu of
// -inf), and the results that are exact in every library agree bit for bit:
// signed zeros, infinities, exp(0) = 1, log(1) = 0, tanh(inf) = 1,
// sigmoid(0) = 0.5.
TEST_F(CudaOpsTest, UnaryOpsAgreeOutsideTheDomainAndAtTheEdges) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> edges = {-0.0, 0.0, -inf, inf};
  const std::pair<const char*, std::vector<double>> cases[] = {
      {"sqrt", {-0.0, 0.0, -inf, inf, -1.0, 1.0, 4.0}},
      {"log", {-0.0, 0.0, -inf, inf, -1.0, 1.0}},
      {"exp", edges},
      {"tanh", edges},
      {"sigmoid", edges},
      {"gelu", edges},
      {"neg", edges},
      {"square", edges},
  };
  for (DataType dtype : {F32, F64}) {
    for (const auto& [op, v] : cases) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", op));
      auto [cpu, gpu] = RunBoth(UnaryOpText(op), {{"x", MakeTensor(dtype, {static_cast<int64_t>(v.size())}, v)}});
      EXPECT_TRUE(SameBitsOrBothNan(gpu, cpu));
    }
  }
}

// sqrt_grad, tanh_grad and sigmoid_grad are IEEE arithmetic: bit for bit.
TEST_F(CudaOpsTest, ArithmeticGradientsEqualTheCpuBitForBit) {
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const int64_t n = NumElements(shape);
      const Tensor dy = MakeTensor(dtype, shape, Uniform(n, 33));
      // a as each forward op produces it: sqrt's output > 0, tanh's in (-1, 1), sigmoid's in (0, 1).
      std::vector<double> sqrt_y = Abs(Uniform(n, 34)), tanh_y = Scaled(Uniform(n, 35), 0.49), sig_y = tanh_y;
      for (double& e : sqrt_y) e += 0.01;
      for (double& e : sig_y) e += 0.5;
      const std::pair<const char*, std::vector<double>> cases[] = {
          {"sqrt_grad", sqrt_y}, {"tanh_grad", tanh_y}, {"sigmoid_grad", sig_y}};
      for (const auto& [op, a] : cases) {
        auto [cpu, gpu] = RunBoth(GradOpText(op), {{"a", MakeTensor(dtype, shape, a)}, {"dy", dy}});
        EXPECT_TRUE(BitEqual(gpu, cpu)) << op;
      }
    }
  }
}

TEST_F(CudaOpsTest, UnaryGradientsRefuseMismatchedShapesWithTheCpuWords) {
  const Tensor a = MakeTensor(F32, {2, 3}, Uniform(6, 36)), dy = MakeTensor(F32, {3, 2}, Uniform(6, 37));
  const Tensor a_gpu = *a.CopyTo(device_.get()), dy_gpu = *dy.CopyTo(device_.get());
  for (const char* op : {"sqrt_grad", "gelu_grad", "tanh_grad", "sigmoid_grad"}) {
    const Op o = ParseOp(GradOpText(op));
    const absl::StatusOr<Tensor> cpu = RunKernel(o, F32, {&a, &dy}, RunContext());
    const absl::StatusOr<Tensor> gpu = RunKernel(o, F32, {&a_gpu, &dy_gpu}, gpu_);
    ASSERT_FALSE(cpu.ok()) << op;
    ASSERT_FALSE(gpu.ok()) << op;
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument) << gpu.status();
    EXPECT_EQ(gpu.status().message(), cpu.status().message());
  }
}

// The ulp bounds (kc + kg) of exp, log, tanh and erf, as the header comment
// derives them.
double ExpUlps(DataType dtype) { return dtype == F32 ? 2 + 1 : 1 + 1; }
double LogUlps(DataType) { return 1 + 1; }
double TanhUlps(DataType) { return 2 + 2; }
double ErfUlps(DataType) { return 2 + 1; }

// exp, log and tanh: one library call, so (kc + kg) * eps * max(|cpu|, |gpu|).
TEST_F(CudaOpsTest, ExpLogTanhAreWithinTheLibrariesUlpBounds) {
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const int64_t n = NumElements(shape);
      std::vector<double> log_in = Uniform(n, 41);
      for (double& e : log_in) e = std::exp(20 * e);  // positive, over many binades
      const struct {
        const char* op;
        std::vector<double> x;
        double ulps;
      } cases[] = {
          {"exp", Scaled(Uniform(n, 42), 40), ExpUlps(dtype)},
          {"log", log_in, LogUlps(dtype)},
          {"tanh", Scaled(Uniform(n, 43), 5), TanhUlps(dtype)},
      };
      for (const auto& c : cases) {
        SCOPED_TRACE(c.op);
        auto [cpu, gpu] = RunBoth(UnaryOpText(c.op), {{"x", MakeTensor(dtype, shape, c.x)}});
        const double k = c.ulps * Eps(dtype);
        ExpectWithin(gpu, cpu,
                     [k](size_t, double want, double got) { return k * std::max(std::abs(want), std::abs(got)); });
      }
    }
  }
}

// sigmoid: 1 / (1 + e) with e = exp(-x) for x >= 0, e / (1 + e) with
// e = exp(x) below. exp's difference k eps e, carried through the sum (one
// rounding each side) and the division (one more), stays within
// (2k + 3) eps |y| on either branch.
TEST_F(CudaOpsTest, SigmoidIsWithinTheBoundFromExp) {
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const Tensor x = MakeTensor(dtype, shape, Scaled(Uniform(NumElements(shape), 44), 15));
      auto [cpu, gpu] = RunBoth(UnaryOpText("sigmoid"), {{"x", x}});
      const double k = (2 * ExpUlps(dtype) + 3) * Eps(dtype);
      ExpectWithin(gpu, cpu,
                   [k](size_t, double want, double got) { return k * std::max(std::abs(want), std::abs(got)); });
    }
  }
}

// gelu: y = (0.5 x) (1 + E), E = erf(x / sqrt 2). The erf results differ by
// k eps |E|; 1 + E rounds on each side (eps |1 + E| between them), and so
// does the product (eps |y|):
// |gpu - cpu| <= |0.5 x| (k eps |E| + eps |1 + E|) + eps |y|.
// gelu_grad: dy (cdf + x pdf), cdf = 0.5 (1 + E), pdf = exp(-x^2 / 2) C. The
// same for cdf (halved), exp's k' eps P for P = exp(-x^2 / 2), then one
// rounding per operation each side:
// |gpu - cpu| <= |dy| (0.5 (k eps |E| + eps |1 + E|) + |x| (C k' eps P + 2 eps pdf) + eps (cdf + |x| pdf)) + eps |dx|.
// Those bounds at x = v and dy without the last rounding of each result (eps
// times the larger of the two, which callers add).
struct GeluBounds {
  double y, dx;
};
GeluBounds GeluErfBounds(DataType dtype, double v, double dy) {
  const double c = 0.5 * M_2_SQRTPI * M_SQRT1_2;
  const double eps = Eps(dtype), k_erf = ErfUlps(dtype) * eps, k_exp = ExpUlps(dtype) * eps;
  const double e = std::erf(v * M_SQRT1_2), p = std::exp(-0.5 * v * v);
  const double cdf = 0.5 * (1 + e), pdf = p * c;
  const double sum = 0.5 * (k_erf * std::abs(e) + eps * std::abs(1 + e)) +
                     std::abs(v) * (c * k_exp * p + 2 * eps * pdf) + eps * (cdf + std::abs(v) * pdf);
  return {std::abs(0.5 * v) * (k_erf * std::abs(e) + eps * std::abs(1 + e)), std::abs(dy) * sum};
}

TEST_F(CudaOpsTest, GeluAndItsGradientAreWithinTheBoundsFromErfAndExp) {
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const int64_t n = NumElements(shape);
      const std::vector<double> xv = Scaled(Uniform(n, 45), 3), dyv = Uniform(n, 46);
      const Tensor x = MakeTensor(dtype, shape, xv), dy = MakeTensor(dtype, shape, dyv);
      // The inputs as the kernels see them (rounded to the dtype).
      const std::vector<double> xs = TensorValues(x), dys = TensorValues(dy);
      const double eps = Eps(dtype);
      auto [y_cpu, y_gpu] = RunBoth(UnaryOpText("gelu"), {{"x", x}});
      ExpectWithin(y_gpu, y_cpu, [&](size_t i, double want, double got) {
        return GeluErfBounds(dtype, xs[i], 0).y + eps * std::max(std::abs(want), std::abs(got));
      });
      auto [dx_cpu, dx_gpu] = RunBoth(GradOpText("gelu_grad"), {{"a", x}, {"dy", dy}});
      ExpectWithin(dx_gpu, dx_cpu, [&](size_t i, double want, double got) {
        return GeluErfBounds(dtype, xs[i], dys[i]).dx + eps * std::max(std::abs(want), std::abs(got));
      });
    }
  }
}

// gelu's tanh form: u = beta (x + kappa x^3) has the same bits on both sides
// (plain IEEE operations, no FMA), t = tanh(u) differs by k eps |t|. Then as
// for erf: |gpu - cpu| <= |0.5 x| (k eps |t| + eps |1 + t|) + eps |y|.
// gelu_grad's tanh form: dy (L + R D), L = 0.5 (1 + t), R = 0.5 x (1 - t^2),
// D = beta (1 + 3 kappa x^2) (same bits). L differs by 0.5 (k eps |t| + eps
// |1 + t|); t^2 by 2 k eps t^2 + eps t^2, 1 - t^2 by that + eps |1 - t^2|, R
// by |0.5 x| times that + eps |R|; R D by |D| times R's + eps |R D|; then one
// rounding for the sum and one for the product with dy.
GeluBounds GeluTanhBounds(DataType dtype, double v, double dy) {
  const double beta = std::sqrt(2 / M_PI), kappa = 0.044715;
  const double eps = Eps(dtype), k_tanh = TanhUlps(dtype) * eps;
  const double t = std::tanh(beta * (v + kappa * v * v * v));
  const double l = 0.5 * (1 + t), r = 0.5 * v * (1 - t * t), d = beta * (1 + 3 * kappa * v * v);
  const double dl = 0.5 * (k_tanh * std::abs(t) + eps * std::abs(1 + t));
  const double dr = std::abs(0.5 * v) * ((2 * k_tanh + eps) * t * t + eps * std::abs(1 - t * t)) + eps * std::abs(r);
  const double sum = dl + std::abs(d) * dr + eps * std::abs(r * d) + eps * (std::abs(l) + std::abs(r * d));
  return {std::abs(0.5 * v) * (k_tanh * std::abs(t) + eps * std::abs(1 + t)), std::abs(dy) * sum};
}

TEST_F(CudaOpsTest, GeluTanhFormAndItsGradientAreWithinTheBoundsFromTanh) {
  const std::string attr = R"pb( attr { key: "approximate" value { s: "tanh" } })pb";
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const int64_t n = NumElements(shape);
      const std::vector<double> xv = Scaled(Uniform(n, 47), 4), dyv = Uniform(n, 48);
      const Tensor x = MakeTensor(dtype, shape, xv), dy = MakeTensor(dtype, shape, dyv);
      const std::vector<double> xs = TensorValues(x), dys = TensorValues(dy);
      const double eps = Eps(dtype);
      auto [y_cpu, y_gpu] = RunBoth(UnaryOpText("gelu") + attr, {{"x", x}});
      ExpectWithin(y_gpu, y_cpu, [&](size_t i, double want, double got) {
        return GeluTanhBounds(dtype, xs[i], 0).y + eps * std::max(std::abs(want), std::abs(got));
      });
      auto [dx_cpu, dx_gpu] = RunBoth(GradOpText("gelu_grad") + attr, {{"a", x}, {"dy", dy}});
      ExpectWithin(dx_gpu, dx_cpu, [&](size_t i, double want, double got) {
        return GeluTanhBounds(dtype, xs[i], dys[i]).dx + eps * std::max(std::abs(want), std::abs(got));
      });
    }
  }
}

// passes/fold_casts: gelu_grad reading a 16-bit dy and storing a 16-bit dx
// is, on the GPU, gelu_grad of the widened dy followed by the cast, bit for
// bit (both forms, both 16-bit types, dy and dx folded alone and together).
std::string CastText(DataType to) {
  return absl::StrCat("type: \"cast\" input: \"x\" output: \"y\" attr { key: \"dtype\" value { s: \"",
                      DataTypeName(to), "\" } }");
}

// gelu's y or gelu_grad's dx stored in 16 bits on both sides: the float
// results are within the float kernels' bounds above (float_bound(i), plus
// their own rounding) and each is rounded once, so they differ by that and
// one 16-bit spacing at most (relative for normals, 2^-24, F16's subnormal
// step, near zero). The float bound counts: in the tail of x the float
// results of the two sides can be a few 16-bit spacings of a tiny dx apart
// (an H200 gave -2.19e-6 where the CPU gave -2.34e-6 in bf16, both within
// the F32 bound).
void ExpectRoundedOnceWithin(const Tensor& gpu, const Tensor& cpu, DataType low,
                             const std::function<double(size_t)>& float_bound) {
  ASSERT_EQ(gpu.dtype(), low);
  ASSERT_EQ(cpu.dtype(), low);
  const double ulp = low == BF16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10), eps = Eps(F32);
  ExpectWithin(gpu, cpu, [&](size_t i, double want, double got) {
    return float_bound(i) + (eps + ulp) * std::max(std::abs(want), std::abs(got)) + std::ldexp(1.0, -24);
  });
}

TEST_F(CudaOpsTest, GeluGradWithFoldedCastsIsTheCastsAroundTheFloatKernel) {
  const Shape shape = {3, 1000, 7};
  const int64_t n = NumElements(shape);
  const Tensor x = MakeTensor(F32, shape, Scaled(Uniform(n, 53), 4));
  for (const char* form : {"none", "tanh"}) {
    for (DataType low : {BF16, F16}) {
      const Tensor dy_low = MakeTensor(low, shape, Uniform(n, 54));
      const Tensor dy_wide = MakeTensor(F32, shape, TensorValues(dy_low));  // exact
      const std::string grad =
          absl::StrCat(GradOpText("gelu_grad"), " attr { key: \"approximate\" value { s: \"", form, "\" } }");
      const std::string out = absl::StrCat(" attr { key: \"out_dtype\" value { s: \"", DataTypeName(low), "\" } }");
      const Tensor want_f32 = RunGpu(grad, {{"a", x}, {"dy", dy_wide}});
      const Tensor want_low = RunGpu(CastText(low), {{"x", want_f32}});
      SCOPED_TRACE(absl::StrCat(form, " ", DataTypeName(low)));
      EXPECT_TRUE(BitEqual(RunGpu(grad, {{"a", x}, {"dy", dy_low}}), want_f32)) << "dy folded";
      EXPECT_TRUE(BitEqual(RunGpu(grad + out, {{"a", x}, {"dy", dy_wide}}), want_low)) << "dx folded";
      EXPECT_TRUE(BitEqual(RunGpu(grad + out, {{"a", x}, {"dy", dy_low}}), want_low)) << "both";
      // And the CPU's folded kernel within the bounds of the float kernels plus one 16-bit rounding.
      auto [cpu, gpu] = RunBoth(grad + out, {{"a", x}, {"dy", dy_low}});
      EXPECT_EQ(gpu.dtype(), low);
      const auto bounds = std::string(form) == "tanh" ? GeluTanhBounds : GeluErfBounds;
      const std::vector<double> xs = TensorValues(x), dys = TensorValues(dy_wide);
      ExpectRoundedOnceWithin(gpu, cpu, low, [&](size_t i) { return bounds(F32, xs[i], dys[i]).dx; });
    }
  }
}

// Mixed precision's gelu and gelu_grad of a 16-bit x (as torch autocast runs
// them): on the GPU, the float kernels on the widened operands followed by
// the cast, bit for bit (both forms, both 16-bit types; dy and dx of x's
// type, the schema's rule). Against the CPU's 16-bit kernels, which round
// the same float functors once: the float results differ by the bounds
// above, so the 16-bit ones by those and one 16-bit spacing
// (ExpectRoundedOnceWithin).
TEST_F(CudaOpsTest, SixteenBitGeluAndItsGradientAreTheFloatKernelsRoundedOnce) {
  for (const Shape& shape : std::vector<Shape>{{}, {0}, {37, 29}, {3, 1000, 7}}) {
    const int64_t n = NumElements(shape);
    for (DataType low : {BF16, F16}) {
      const Tensor x = MakeTensor(low, shape, Scaled(Uniform(n, 55), 4));
      const Tensor x_wide = MakeTensor(F32, shape, TensorValues(x));  // exact
      const Tensor dy_low = MakeTensor(low, shape, Uniform(n, 56));
      const Tensor dy_wide = MakeTensor(F32, shape, TensorValues(dy_low));  // exact
      for (const char* form : {"none", "tanh"}) {
        SCOPED_TRACE(absl::StrCat(ShapeString(shape), " ", DataTypeName(low), " ", form));
        const std::string attr = absl::StrCat(" attr { key: \"approximate\" value { s: \"", form, "\" } }");
        const auto bounds = std::string(form) == "tanh" ? GeluTanhBounds : GeluErfBounds;
        const std::vector<double> xs = TensorValues(x), dys = TensorValues(dy_low);

        const Tensor y_float = RunGpu(UnaryOpText("gelu") + attr, {{"x", x_wide}});
        const Tensor y = RunGpu(UnaryOpText("gelu") + attr, {{"x", x}});
        EXPECT_TRUE(BitEqual(y, RunGpu(CastText(low), {{"x", y_float}}))) << "gelu";
        auto [y_cpu, y_gpu] = RunBoth(UnaryOpText("gelu") + attr, {{"x", x}});
        ExpectRoundedOnceWithin(y_gpu, y_cpu, low, [&](size_t i) { return bounds(F32, xs[i], 0).y; });

        // A 16-bit x takes a dy of its type and gives dx in it.
        const std::string grad = GradOpText("gelu_grad") + attr;
        const Tensor dx_float = RunGpu(grad, {{"a", x_wide}, {"dy", dy_wide}});
        const Tensor dx = RunGpu(grad, {{"a", x}, {"dy", dy_low}});
        EXPECT_TRUE(BitEqual(dx, RunGpu(CastText(low), {{"x", dx_float}}))) << "gelu_grad";
        auto [dx_cpu, dx_gpu] = RunBoth(grad, {{"a", x}, {"dy", dy_low}});
        ExpectRoundedOnceWithin(dx_gpu, dx_cpu, low, [&](size_t i) { return bounds(F32, xs[i], dys[i]).dx; });
      }
    }
  }
}

TEST_F(CudaOpsTest, UnaryLaunchersCoverTensorsLargerThanTheGrid) {
  const Tensor x = RandomTensor(F32, kBig, 51), dy = RandomTensor(F32, kBig, 52);
  auto [neg_cpu, neg_gpu] = RunBoth(UnaryOpText("neg"), {{"x", x}});
  EXPECT_TRUE(BitEqual(neg_gpu, neg_cpu));
  auto [scale_cpu, scale_gpu] = RunBoth(ScaleOpText(1.7, -0.3), {{"x", x}});
  EXPECT_TRUE(BitEqual(scale_gpu, scale_cpu));
  auto [grad_cpu, grad_gpu] = RunBoth(GradOpText("tanh_grad"), {{"a", x}, {"dy", dy}});
  EXPECT_TRUE(BitEqual(grad_gpu, grad_cpu));
  auto [exp_cpu, exp_gpu] = RunBoth(UnaryOpText("exp"), {{"x", x}});
  const double k = ExpUlps(F32) * Eps(F32);
  ExpectWithin(exp_gpu, exp_cpu,
               [k](size_t, double want, double got) { return k * std::max(std::abs(want), std::abs(got)); });
  auto [sum_cpu, sum_gpu] = RunBoth(R"pb(type: "add_n"
                                         input: [ "a", "b", "c" ]
                                         output: "y")pb",
                                    {{"a", x}, {"b", dy}, {"c", x}});
  EXPECT_TRUE(BitEqual(sum_gpu, sum_cpu));
  auto [cast_cpu, cast_gpu] = RunBoth(R"pb(type: "cast"
                                           input: "x"
                                           output: "y"
                                           attr {
                                             key: "dtype"
                                             value { s: "BF16" }
                                           })pb",
                                      {{"x", x}});
  EXPECT_TRUE(BitEqual(cast_gpu, cast_cpu));
}

std::string AddNText(int count) {
  std::string inputs;
  for (int i = 0; i < count; ++i) absl::StrAppend(&inputs, i ? ", " : "", "\"x", i, "\"");
  return absl::StrCat(
      R"pb(                                      type: "add_n" input: [)pb", inputs,
      R"pb(                                                                                                           ] output: "y")pb");
}

// The CPU's order, ((x0 + x1) + x2) + ..., also past one launch's 16 inputs:
// bit for bit, and the same bits on a second run. BF16 and F16 as the CPU's widened
// kernel: summed in float in that order (partial sums kept in float between
// launches), rounded once.
TEST_F(CudaOpsTest, AddNEqualsTheCpuBitForBitInItsOrder) {
  for (DataType dtype : {F32, F64, I64, BF16, F16}) {
    for (const Shape& shape : ElementwiseShapes()) {
      for (int count : {1, 2, 3, 16, 17, 33}) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape), " ", count, " inputs"));
        std::map<std::string, Tensor> inputs;
        for (int i = 0; i < count; ++i) {
          // Magnitudes far apart, so the order shows in the rounding; in
          // F16 at most 2 * 7^3, so 33 of them stay below its 65504.
          const int spread = dtype == F16 ? 4 : 9;
          const std::vector<double> v = dtype == I64
                                            ? Integers(NumElements(shape), 60 + i)
                                            : Scaled(Uniform(NumElements(shape), 60 + i), std::pow(7.0, i % spread));
          inputs[absl::StrCat("x", i)] = MakeTensor(dtype, shape, v);
        }
        auto [cpu, gpu] = RunBoth(AddNText(count), inputs);
        EXPECT_TRUE(BitEqual(gpu, cpu));
        auto [cpu2, gpu2] = RunBoth(AddNText(count), inputs);
        EXPECT_TRUE(BitEqual(gpu2, gpu));
      }
    }
  }
}

TEST_F(CudaOpsTest, AddNOfOneInputSharesItsBufferAndRefusesMismatchesWithTheCpuWords) {
  const Tensor a = MakeTensor(F32, {2, 3}, Uniform(6, 70)), b = MakeTensor(F32, {3, 2}, Uniform(6, 71));
  const Tensor a_gpu = *a.CopyTo(device_.get()), b_gpu = *b.CopyTo(device_.get());
  const absl::StatusOr<Tensor> one = RunKernel(ParseOp(AddNText(1)), F32, {&a_gpu}, gpu_);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(one->raw_data(), a_gpu.raw_data());
  const Op two = ParseOp(AddNText(2));
  const absl::StatusOr<Tensor> cpu = RunKernel(two, F32, {&a, &b}, RunContext());
  const absl::StatusOr<Tensor> gpu = RunKernel(two, F32, {&a_gpu, &b_gpu}, gpu_);
  ASSERT_FALSE(cpu.ok());
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kInvalidArgument) << gpu.status();
  EXPECT_EQ(gpu.status().message(), cpu.status().message());
}

// Values that probe every conversion: signed zeros, halves (truncation and
// round-to-even), 16-bit float ties, subnormals and overflow of F16, the
// int32 and int64 edges (saturation), infinities and nan.
std::vector<double> CastValues(DataType from, int64_t n_random) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> v;
  if (from == BOOL) {
    v = {0, 1, 1, 0};
  } else if (from == I32) {
    v = {0, 1, -1, 7, -7, 255, 256, 65504, 65520, 16777217, 2147483647, -2147483648.0, 1000000007};
  } else if (from == I64) {
    v = {0, 1, -1, 7, 65520, 16777217, 2147483648.0, -2147483649.0, 0x1p53, 0x1p62, -0x1p63, 123456789012345.0};
  } else {
    v = {0.0,     -0.0, 0.5,   -0.5,  1.5,   2.5,   -2.5,  1.0 / 3, 1 + 0x1p-8, 1 + 3 * 0x1p-8, 1 + 0x1p-11,   1e-6,
         6e-8,    3e-8, 1e-40, 65504, 65519, 65520, 70000, 3e9,     -3e9,       2147483647.5,   -2147483648.5, 9.3e18,
         -9.3e18, 1e20, -1e20, 1e300, inf,   -inf,  nan,   -nan};
  }
  const std::vector<double> random = from == BOOL                 ? std::vector<double>(n_random, 1.0)
                                     : from == I32 || from == I64 ? Integers(n_random, 80)
                                                                  : Scaled(Uniform(n_random, 81), 1000);
  v.insert(v.end(), random.begin(), random.end());
  return v;
}

// Every (from, to) pair: bit for bit (NaN matching any NaN), on a vector of
// probes, a rank-0 tensor and an empty one; the same dtype shares x's buffer.
TEST_F(CudaOpsTest, CastEqualsTheCpuBitForBitForEveryPair) {
  const DataType dtypes[] = {F32, F64, I64, I32, BOOL, BF16, F16};
  for (DataType from : dtypes) {
    const std::vector<double> values = CastValues(from, 300);
    const Tensor inputs[] = {MakeTensor(from, {static_cast<int64_t>(values.size())}, values),
                             MakeTensor(from, {}, {values[2]}), MakeTensor(from, {0, 4}, {})};
    for (DataType to : dtypes) {
      const std::string op = absl::StrCat(R"pb(type: "cast"
                                               input: "x"
                                               output: "y"
                                               attr { key: "dtype"
                                                      value { s: ")pb",
                                          DataTypeName(to), "\" } }");
      for (const Tensor& x : inputs) {
        SCOPED_TRACE(absl::StrCat(DataTypeName(from), " -> ", DataTypeName(to), " ", ShapeString(x.shape())));
        const Tensor x_gpu = *x.CopyTo(device_.get());
        const absl::StatusOr<Tensor> cpu = RunKernel(ParseOp(op), from, {&x}, RunContext());
        const absl::StatusOr<Tensor> gpu = RunKernel(ParseOp(op), from, {&x_gpu}, gpu_);
        ASSERT_TRUE(cpu.ok()) << cpu.status();
        ASSERT_TRUE(gpu.ok()) << gpu.status();
        if (from == to) {
          EXPECT_EQ(gpu->raw_data(), x_gpu.raw_data());
        }
        EXPECT_TRUE(SameBitsOrBothNan(gpu->Clone(GetCpuAllocator()), *cpu));
        ASSERT_TRUE(device_->Synchronize().ok());
      }
    }
  }
}

TEST_F(CudaOpsTest, CastRefusesAnUnknownDtypeWithTheCpuWords) {
  const Op op = ParseOp(R"pb(type: "cast"
                             input: "x"
                             output: "y"
                             attr {
                               key: "dtype"
                               value { s: "F8" }
                             })pb");
  const KernelFactory* cpu = KernelRegistry::Global().Find("cast", DEVICE_CPU, F32);
  const KernelFactory* gpu = KernelRegistry::Global().Find("cast", DEVICE_CUDA, F32);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(gpu, nullptr);
  KernelDef def;
  def.op = &op;
  const auto cpu_kernel = (*cpu)(def);
  const auto gpu_kernel = (*gpu)(def);
  ASSERT_FALSE(cpu_kernel.ok());
  ASSERT_FALSE(gpu_kernel.ok());
  EXPECT_EQ(gpu_kernel.status().message(), cpu_kernel.status().message());
  EXPECT_EQ(gpu_kernel.status().message(), "cast: unknown dtype 'F8'");
}

// acc += x in place: the CPU's one IEEE add per element, bit for bit; the
// output is acc's own buffer.
TEST_F(CudaOpsTest, AccumulateAddsInPlaceBitForBit) {
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const Tensor acc = RandomTensor(dtype, shape, 90), x = RandomTensor(dtype, shape, 91);
      auto out = RunBothNamed(R"pb(type: "accumulate"
                                   input: [ "acc", "x" ]
                                   output: "acc")pb",
                              {{"acc", acc}, {"x", x}}, {"acc"});
      ASSERT_EQ(out.size(), 1u);
      EXPECT_TRUE(BitEqual(out[0].second, out[0].first));
    }
  }
  const Tensor acc = *RandomTensor(F32, {5, 7}, 92).CopyTo(device_.get());
  const Tensor x = *RandomTensor(F32, {35}, 93).CopyTo(device_.get());  // same count, other shape: allowed
  const Tensor before = acc.Clone(GetCpuAllocator());
  const Op op = ParseOp(R"pb(type: "accumulate"
                             input: [ "acc", "x" ]
                             output: "acc")pb");
  const absl::StatusOr<Tensor> out = RunKernel(op, F32, {&acc, &x}, gpu_);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->raw_data(), acc.raw_data());
  const std::vector<double> a = TensorValues(before), b = TensorValues(x.Clone(GetCpuAllocator())),
                            got = TensorValues(acc.Clone(GetCpuAllocator()));
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i], static_cast<double>(static_cast<float>(a[i]) + static_cast<float>(b[i]))) << i;
  }
}

TEST_F(CudaOpsTest, AccumulateRefusesOtherCountsWithTheCpuWords) {
  const Tensor acc = RandomTensor(F32, {2, 3}, 94), x = RandomTensor(F32, {4}, 95);
  const Tensor acc_gpu = *acc.CopyTo(device_.get()), x_gpu = *x.CopyTo(device_.get());
  const Op op = ParseOp(R"pb(type: "accumulate"
                             input: [ "acc", "x" ]
                             output: "acc")pb");
  const absl::StatusOr<Tensor> cpu = RunKernel(op, F32, {&acc, &x}, RunContext());
  const absl::StatusOr<Tensor> gpu = RunKernel(op, F32, {&acc_gpu, &x_gpu}, gpu_);
  ASSERT_FALSE(cpu.ok());
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().message(), cpu.status().message());
}

TEST_F(CudaOpsTest, FillZeroZeroesInPlace) {
  for (DataType dtype : {F32, F64}) {
    for (const Shape& shape : ElementwiseShapes()) {
      SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", ShapeString(shape)));
      const Tensor x = RandomTensor(dtype, shape, 96);
      auto out = RunBothNamed(R"pb(type: "fill_zero" input: "x" output: "x")pb", {{"x", x}}, {"x"});
      ASSERT_EQ(out.size(), 1u);
      EXPECT_TRUE(BitEqual(out[0].second, out[0].first));
      const Tensor on_gpu = *x.CopyTo(device_.get());
      const absl::StatusOr<Tensor> y =
          RunKernel(ParseOp(R"pb(type: "fill_zero" input: "x" output: "x")pb"), dtype, {&on_gpu}, gpu_);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(y->raw_data(), on_gpu.raw_data());
      EXPECT_TRUE(BitEqual(on_gpu.Clone(GetCpuAllocator()), Tensor::Zeros(dtype, shape)));
    }
  }
}

// The value converts on the host through Tensor::Fill, as on the CPU.
TEST_F(CudaOpsTest, FillScalarEqualsTheCpuBitForBit) {
  for (const char* dtype : {"F32", "F64"}) {
    for (double value : {0.1, -2.7, 3.0, 0.0, 1e300}) {
      SCOPED_TRACE(absl::StrCat(dtype, " value ", value));
      auto [cpu, gpu] = RunBoth(absl::StrCat("type: \"fill_scalar\" output: \"y\" attr { key: \"dtype\" value { s: \"",
                                             dtype, "\" } } attr { key: \"value\" value { f: ", value, " } }"),
                                {});
      EXPECT_TRUE(BitEqual(gpu, cpu));
      EXPECT_EQ(gpu.rank(), 0);
    }
  }
}

TEST_F(CudaOpsTest, IdentitySharesTheInputsBuffer) {
  for (DataType dtype : {F32, F64, I64, I32, BOOL}) {
    SCOPED_TRACE(DataTypeName(dtype));
    const Tensor x = MakeTensor(dtype, {4, 3}, dtype == BOOL ? std::vector<double>(12, 1.0) : Integers(12, 97));
    auto [cpu, gpu] = RunBoth(R"pb(type: "identity" input: "x" output: "y")pb", {{"x", x}});
    EXPECT_TRUE(BitEqual(gpu, cpu));
    const Tensor on_gpu = *x.CopyTo(device_.get());
    const absl::StatusOr<Tensor> y =
        RunKernel(ParseOp(R"pb(type: "identity" input: "x" output: "y")pb"), dtype, {&on_gpu}, gpu_);
    ASSERT_TRUE(y.ok()) << y.status();
    EXPECT_EQ(y->raw_data(), on_gpu.raw_data());
  }
}

constexpr char kReshape[] = R"pb(type: "reshape"
                                 input: "x"
                                 output: "y"
                                 attr {
                                   key: "shape"
                                   value { list { i: [ 3, -1, 2 ] } }
                                 })pb";
constexpr char kFlatten[] = R"pb(type: "flatten"
                                 input: "x"
                                 output: "y"
                                 attr {
                                   key: "start_axis"
                                   value { i: 1 }
                                 }
                                 attr {
                                   key: "end_axis"
                                   value { i: -1 }
                                 })pb";
constexpr char kReshapeLike[] = R"pb(type: "reshape_like"
                                     input: [ "x", "like" ]
                                     output: "y")pb";

// Views: the CPU's shapes and values, and the output is x's own buffer.
TEST_F(CudaOpsTest, ReshapeFlattenAndReshapeLikeShareTheInputsBuffer) {
  for (DataType dtype : {F32, F64, I64, BF16, F16}) {
    SCOPED_TRACE(DataTypeName(dtype));
    const Tensor x = RandomTensor(dtype, {2, 3, 4}, 98), like = RandomTensor(dtype, {4, 6}, 99);
    for (const char* text : {kReshape, kFlatten, kReshapeLike}) {
      SCOPED_TRACE(text);
      auto [cpu, gpu] = RunBoth(text, {{"x", x}, {"like", like}});
      EXPECT_TRUE(BitEqual(gpu, cpu));
      const Tensor x_gpu = *x.CopyTo(device_.get()), like_gpu = *like.CopyTo(device_.get());
      const Op op = ParseOp(text);
      std::vector<const Tensor*> in = {&x_gpu};
      if (op.input_size() == 2) in.push_back(&like_gpu);
      const absl::StatusOr<Tensor> y = RunKernel(op, dtype, in, gpu_);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(y->raw_data(), x_gpu.raw_data());
      EXPECT_EQ(y->shape(), cpu.shape());
    }
  }
}

TEST_F(CudaOpsTest, ViewsRefuseWhatTheCpuRefusesWithTheSameWords) {
  const Tensor x = RandomTensor(F32, {2, 5}, 100), like = RandomTensor(F32, {4, 3}, 101);
  const Tensor x_gpu = *x.CopyTo(device_.get()), like_gpu = *like.CopyTo(device_.get());
  for (const char* text : {kReshape, kReshapeLike}) {
    SCOPED_TRACE(text);
    const Op op = ParseOp(text);
    std::vector<const Tensor*> cpu_in = {&x}, gpu_in = {&x_gpu};
    if (op.input_size() == 2) {
      cpu_in.push_back(&like);
      gpu_in.push_back(&like_gpu);
    }
    const absl::StatusOr<Tensor> cpu = RunKernel(op, F32, cpu_in, RunContext());
    const absl::StatusOr<Tensor> gpu = RunKernel(op, F32, gpu_in, gpu_);
    ASSERT_FALSE(cpu.ok());
    ASSERT_FALSE(gpu.ok());
    EXPECT_EQ(gpu.status().message(), cpu.status().message());
  }
}

}  // namespace
}  // namespace strata
