// pool.cu, launchers included, on the CPU (the genrule pool_emulated_src
// rewrites its <<<>>> launches into calls of testing/cuda_stand_in/'s Launch;
// g++ compiles it against the stand-ins): max_pool2d, avg_pool2d and their
// gradients give the registered CPU kernels' bits (kernels/cpu/pool2d.cc,
// run through the registry), in F32 and F64, over windows that overlap,
// pad, skip inputs (stride past the kernel) and cover one element, with
// ties and a NaN in the max's windows (the CPU's ArgMax rule), and both avg
// divisors. Outputs start poisoned, so an element no thread writes shows.

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/testing/op_test_util.h"
#include "gtest/gtest.h"
#include "kernels/cuda/pool.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"

namespace strata {
namespace {

struct PoolCase {
  const char* name;
  int64_t n, c, h, w;
  int64_t kh, kw, sh, sw, ph, pw;
};

constexpr PoolCase kCases[] = {
    {"overlapping and padded", 2, 3, 7, 6, 3, 3, 2, 1, 1, 1}, {"non-overlapping", 1, 2, 8, 8, 2, 2, 2, 2, 0, 0},
    {"stride past the kernel", 2, 1, 9, 7, 2, 1, 3, 3, 0, 0}, {"one-element windows", 1, 1, 5, 4, 1, 1, 1, 1, 0, 0},
    {"windows mostly padding", 1, 2, 3, 3, 3, 3, 1, 1, 1, 1},
};

int64_t Out(int64_t in, int64_t k, int64_t s, int64_t p) { return (in + 2 * p - k) / s + 1; }

std::string Attrs(const PoolCase& c) {
  return absl::StrCat("attr { key: \"kernel_size\" value { list { i: [", c.kh, ", ", c.kw, "] } } }",
                      " attr { key: \"strides\" value { list { i: [", c.sh, ", ", c.sw, "] } } }",
                      " attr { key: \"paddings\" value { list { i: [", c.ph, ", ", c.pw, "] } } }");
}

// x with ties (values on a coarse grid) and, for the max's windows, one NaN.
template <typename T>
Tensor Input(DataType dtype, const PoolCase& c, bool with_nan, uint32_t seed) {
  std::vector<double> v = emulation::UniformValues(c.n * c.c * c.h * c.w, seed, 4);
  for (double& x : v) x = std::round(x * 2) / 2;  // ties in most windows
  if (with_nan) v[v.size() / 3] = std::numeric_limits<double>::quiet_NaN();
  return MakeTensor(dtype, {c.n, c.c, c.h, c.w}, v);
}

template <typename T>
void Check(DataType dtype, const PoolCase& c) {
  SCOPED_TRACE(absl::StrCat(DataTypeName(dtype), " ", c.name));
  const int64_t ho = Out(c.h, c.kh, c.sh, c.ph), wo = Out(c.w, c.kw, c.sw, c.pw);
  ASSERT_GT(ho, 0);
  ASSERT_GT(wo, 0);
  const cuda::Pool2dShape g{c.n * c.c, c.h, c.w, ho, wo, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw};
  const std::string attrs = Attrs(c);
  // avg_pool2d_grad learns x's [H, W] from this attr (autodiff writes it).
  const std::string size = absl::StrCat(" attr { key: \"input_size\" value { list { i: [", c.h, ", ", c.w, "] } } }");
  for (const bool with_nan : {false, true}) {
    SCOPED_TRACE(with_nan ? "a NaN in x" : "finite x");
    std::map<std::string, Tensor> env{
        {"x", Input<T>(dtype, c, with_nan, 7)},
        {"dy", MakeTensor(dtype, {c.n, c.c, ho, wo}, emulation::UniformValues(c.n * c.c * ho * wo, 11, 2))}};
    const absl::Status s =
        RunOps({ParseOp(absl::StrCat(R"pb(type: "max_pool2d" input: "x" output: "ymax" )pb", attrs)),
                ParseOp(absl::StrCat(R"pb(type: "max_pool2d_grad" input: ["x", "dy"] output: "dxmax" )pb", attrs)),
                ParseOp(absl::StrCat(R"pb(type: "avg_pool2d" input: "x" output: "yavg" )pb", attrs)),
                ParseOp(absl::StrCat(R"pb(type: "avg_pool2d_grad" input: "dy" output: "dxavg" )pb", attrs, size)),
                ParseOp(absl::StrCat(R"pb(type: "avg_pool2d" input: "x" output: "yexc"
                                   attr { key: "exclusive" value { b: true } } )pb",
                                     attrs)),
                ParseOp(absl::StrCat(R"pb(type: "avg_pool2d_grad" input: "dy" output: "dxexc"
                                   attr { key: "exclusive" value { b: true } } )pb",
                                     attrs, size))},
               &env);
    ASSERT_TRUE(s.ok()) << s;
    const T* x = env["x"].data<T>();
    const T* dy = env["dy"].data<T>();
    const int64_t ny = g.planes * ho * wo, nx = g.planes * c.h * c.w;
    std::vector<T> ymax = emulation::Poisoned<T>(ny), yavg = emulation::Poisoned<T>(ny),
                   yexc = emulation::Poisoned<T>(ny);
    std::vector<T> dxmax = emulation::Poisoned<T>(nx), dxavg = emulation::Poisoned<T>(nx),
                   dxexc = emulation::Poisoned<T>(nx);
    ASSERT_EQ(cuda::LaunchMaxPool2d(ymax.data(), x, g, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchMaxPool2dGrad(dxmax.data(), x, dy, g, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchAvgPool2d(yavg.data(), x, g, /*exclusive=*/false, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchAvgPool2dGrad(dxavg.data(), dy, g, /*exclusive=*/false, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchAvgPool2d(yexc.data(), x, g, /*exclusive=*/true, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::LaunchAvgPool2dGrad(dxexc.data(), dy, g, /*exclusive=*/true, nullptr), cudaSuccess);
    emulation::ExpectCleanLaunches();
    EXPECT_TRUE(emulation::SameBits(ymax, env["ymax"], "max_pool2d"));
    EXPECT_TRUE(emulation::SameBits(dxmax, env["dxmax"], "max_pool2d_grad"));
    EXPECT_TRUE(emulation::SameBits(yavg, env["yavg"], "avg_pool2d"));
    EXPECT_TRUE(emulation::SameBits(dxavg, env["dxavg"], "avg_pool2d_grad"));
    EXPECT_TRUE(emulation::SameBits(yexc, env["yexc"], "avg_pool2d exclusive"));
    EXPECT_TRUE(emulation::SameBits(dxexc, env["dxexc"], "avg_pool2d_grad exclusive"));
  }
}

TEST(PoolEmulation, MaxAndAvgAndTheirGradientsAreTheCpuBits) {
  for (const PoolCase& c : kCases) {
    Check<float>(F32, c);
    Check<double>(F64, c);
  }
}

}  // namespace
}  // namespace strata
