// oneDNN's bf16 and f32 GEMMs (onednn_gemm.h) against a float64 reference: exact for
// small-integer operands (every product and partial sum is an integer below
// 2^24, so any order of the additions gives the same float), within the
// float summation bound for arbitrary bf16 operands; every transpose,
// leading dimensions wider than the rows, beta 0, 1 and 0.5, empty sizes,
// and a GEMM cut into panels over the pool (bf16; f32 through gemm.h's
// GemmOrScale, whose GEMMs go to oneDNN above a size). OnednnGemm is called
// directly, so the f32 cases run on any CPU and the bf16 ones wherever
// oneDNN has a bf16 matmul (AVX-512 and up; on an older CPU they check
// instead that it answers Unimplemented, naming the GEMM, and that the
// kernels widen); the kernels use it only where NativeBf16Gemm() or
// OnednnF32Gemm().

#include "kernels/cpu/onednn_gemm.h"

#include <oneapi/dnnl/dnnl.h>

#include <cmath>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/gemm.h"
#include "kernels/env_switch.h"
#include "runtime/device.h"
#include "runtime/float16.h"

namespace strata {
namespace {

struct Problem {
  bool ta = false, tb = false;
  int64_t m = 0, n = 0, k = 0, pad = 0;  // leading dimensions are the row length + pad
  int64_t lda() const { return (ta ? m : k) + pad; }
  int64_t ldb() const { return (tb ? k : n) + pad; }
  int64_t ldc() const { return n + pad; }
  int64_t a_rows() const { return ta ? k : m; }
  int64_t b_rows() const { return tb ? n : k; }
  std::string Name() const {
    return absl::StrCat(m, "x", n, "x", k, ta ? " ta" : "", tb ? " tb" : "", " pad ", pad);
  }
};

// Operands as bf16 with their float values beside (the f32 GEMMs read
// those: bf16-representable floats, so the same references hold).
struct Operands {
  std::vector<bfloat16> a, b;
  std::vector<float> af, bf;
};

// Whether oneDNN has a bf16 matmul on this CPU; where it has none, its
// answer must be an Unimplemented error naming the GEMM, and the kernels
// must not take the native path.
bool Bf16Here() {
  static const bool here = [] {
    const bfloat16 one = ToBfloat16(1.0f);
    float c = 0;
    const absl::Status s = OnednnGemm(false, false, 1, 1, 1, &one, 1, &one, 1, 0.0f, &c, 1);
    if (s.ok()) {
      EXPECT_EQ(c, 1.0f);
      return true;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_NE(s.message().find("bf16 GEMM 1x1x1"), std::string::npos) << s;
    EXPECT_FALSE(NativeBf16Gemm());
    return false;
  }();
  return here;
}

// How Check runs the GEMM.
enum class Path { kBf16, kBf16Panels, kF32, kF32Panels };

Operands Make(const Problem& p, bool integers, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-8, 8);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Operands o;
  auto fill = [&](int64_t count, std::vector<bfloat16>* h, std::vector<float>* f) {
    h->resize(count);
    f->resize(count);
    for (int64_t i = 0; i < count; ++i) {
      (*h)[i] = ToBfloat16(integers ? static_cast<float>(small(rng)) : normal(rng));
      (*f)[i] = ToFloat((*h)[i]);
    }
  };
  fill(p.a_rows() * p.lda(), &o.a, &o.af);
  fill(p.b_rows() * p.ldb(), &o.b, &o.bf);
  return o;
}

// op(a)[i, l] and op(b)[l, j] as stored.
float A(const Problem& p, const Operands& o, int64_t i, int64_t l) {
  return p.ta ? o.af[l * p.lda() + i] : o.af[i * p.lda() + l];
}
float B(const Problem& p, const Operands& o, int64_t l, int64_t j) {
  return p.tb ? o.bf[j * p.ldb() + l] : o.bf[l * p.ldb() + j];
}

// Runs the GEMM over c (ldc-wide rows, padding columns set to a marker) and
// checks every element against the float64 reference: exactly, or within
// K * 2^-23 * sum |a b| (float summation in any order) plus beta's term.
void Check(const Problem& p, bool integers, float beta, Path path, float alpha = 1.0f) {
  SCOPED_TRACE(absl::StrCat(p.Name(), integers ? " integers" : " normal", " alpha ", alpha, " beta ", beta, " path ",
                            static_cast<int>(path)));
  const bool bf16 = path != Path::kF32 && path != Path::kF32Panels;
  if (bf16 && !Bf16Here()) return;  // Bf16Here checked oneDNN's answer instead
  const Operands o = Make(p, integers, static_cast<uint32_t>(p.m * 131 + p.n * 17 + p.k));
  constexpr float kMarker = 12288.0f;  // exact in bf16 too
  std::vector<float> c(static_cast<size_t>(std::max<int64_t>(p.m, 1) * p.ldc()), kMarker);
  std::vector<float> c0(c.size());
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.n; ++j) c[i * p.ldc() + j] = static_cast<float>((i * 7 + j * 3) % 11 - 5);
  }
  c0 = c;
  absl::Status s;
  switch (path) {
    case Path::kBf16:
      s = OnednnGemm(p.ta, p.tb, p.m, p.n, p.k, o.a.data(), p.lda(), o.b.data(), p.ldb(), beta, c.data(), p.ldc());
      break;
    case Path::kBf16Panels:
      s = GemmOrScale(p.ta, p.tb, p.m, p.n, p.k, 1.0f, o.a.data(), p.lda(), o.b.data(), p.ldb(), beta, c.data(),
                      p.ldc());
      break;
    case Path::kF32:
      s = OnednnGemm(p.ta, p.tb, p.m, p.n, p.k, alpha, o.af.data(), p.lda(), o.bf.data(), p.ldb(), beta, c.data(),
                     p.ldc());
      break;
    case Path::kF32Panels:
      GemmOrScale<float>(p.ta, p.tb, p.m, p.n, p.k, alpha, o.af.data(), p.lda(), o.bf.data(), p.ldb(), beta,
                         c.data(), p.ldc());
      break;
  }
  ASSERT_TRUE(s.ok()) << s;
  int64_t wrong = 0;
  for (int64_t i = 0; i < p.m; ++i) {
    for (int64_t j = 0; j < p.ldc(); ++j) {
      const float got = c[i * p.ldc() + j];
      if (j >= p.n) {
        wrong += got != kMarker;  // the padding is never written
        continue;
      }
      double want = beta == 0.0f ? 0.0 : static_cast<double>(beta) * c0[i * p.ldc() + j];
      double magnitude = std::abs(want);
      for (int64_t l = 0; l < p.k; ++l) {
        const double prod = static_cast<double>(alpha) * A(p, o, i, l) * B(p, o, l, j);
        want += prod;
        magnitude += std::abs(prod);
      }
      const double bound = integers ? 0.0 : static_cast<double>(p.k + 1) * std::ldexp(1.0, -23) * magnitude;
      if (std::abs(got - want) > bound) {
        if (++wrong <= 3) ADD_FAILURE() << "c[" << i << ", " << j << "] = " << got << ", want " << want;
      }
    }
  }
  EXPECT_EQ(wrong, 0);
}

TEST(OnednnGemmTest, EveryTransposeAndLeadingDimensionMatchesTheReference) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {5, 7, 3}, {33, 17, 65},
                             {130, 70, 300}}) {
        for (int64_t pad : {0, 3}) {
          const Problem p{ta, tb, m, n, k, pad};
          for (float beta : {0.0f, 1.0f, 0.5f}) {
            Check(p, /*integers=*/true, beta, Path::kBf16);
            Check(p, /*integers=*/true, beta, Path::kF32);
          }
          Check(p, /*integers=*/false, 0.0f, Path::kBf16);
          Check(p, /*integers=*/false, 0.0f, Path::kF32);
          Check(p, /*integers=*/true, 1.0f, Path::kF32, /*alpha=*/0.25f);  // attention's scale
          Check(p, /*integers=*/false, 0.0f, Path::kF32, /*alpha=*/0.125f);
        }
      }
    }
  }
}

// Large enough to be cut (gemm.h's kSingleThreadedGemmWork): by rows when
// m >= n, by columns otherwise; the same shapes run again on warm
// primitives, several threads at once on one primitive. The f32 panels go
// to oneDNN where OnednnF32Gemm(), else to OpenBLAS (the same bound holds).
TEST(OnednnGemmTest, APanelledGemmMatchesTheReference) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{512, 96, 128}, {40, 1000, 96}}) {
        const Problem p{ta, tb, m, n, k, 1};
        for (int round = 0; round < 2; ++round) {
          Check(p, /*integers=*/true, 0.0f, Path::kBf16Panels);
          Check(p, /*integers=*/true, 1.0f, Path::kBf16Panels);
          Check(p, /*integers=*/false, 0.0f, Path::kBf16Panels);
          Check(p, /*integers=*/true, 1.0f, Path::kF32Panels, 0.5f);
          Check(p, /*integers=*/false, 0.0f, Path::kF32Panels);
        }
      }
    }
  }
}

// GemmOrScale's result is its panels' (CutGemm's, a function of the sizes
// only) computed one after another on one thread: the same bits whatever
// the pool's thread count, for row and column cuts and transposed A (where
// oneDNN's bits depend on the panel).
TEST(OnednnGemmTest, APanelledGemmHasItsPanelsBitsWhateverTheThreads) {
  for (bool ta : {false, true}) {
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{768, 96, 512}, {96, 768, 512}, {700, 650, 300}}) {
      const Problem p{ta, false, m, n, k, 0};
      SCOPED_TRACE(p.Name());
      const GemmCut cut = CutGemm(m, n, k);
      ASSERT_GT(cut.count, 1);
      int64_t covered = 0;
      for (int64_t i = 0; i < cut.count; ++i) {
        const int64_t length = cut.by_rows ? m : n;
        ASSERT_EQ(cut.Begin(i, length), covered);
        ASSERT_GT(cut.End(i, length), cut.Begin(i, length));
        covered = cut.End(i, length);
      }
      EXPECT_EQ(covered, cut.by_rows ? m : n);
      const Operands o = Make(p, /*integers=*/false, 7);
      std::vector<float> pooled(m * n), serial(m * n), pooled32(m * n), serial32(m * n);
      const bool bf16 = Bf16Here();
      if (bf16) {
        ASSERT_TRUE(GemmOrScale(ta, false, m, n, k, 1.0f, o.a.data(), p.lda(), o.b.data(), p.ldb(), 0.0f,
                                pooled.data(), n)
                        .ok());
      }
      GemmOrScale<float>(ta, false, m, n, k, 1.0f, o.af.data(), p.lda(), o.bf.data(), p.ldb(), 0.0f, pooled32.data(),
                         n);
      for (int64_t i = 0; i < cut.count; ++i) {
        const int64_t r0 = cut.by_rows ? cut.Begin(i, m) : 0, r1 = cut.by_rows ? cut.End(i, m) : m;
        const int64_t c0 = cut.by_rows ? 0 : cut.Begin(i, n), c1 = cut.by_rows ? n : cut.End(i, n);
        const int64_t a_off = ta ? r0 : r0 * p.lda(), c_off = r0 * n + c0;
        if (bf16) {
          ASSERT_TRUE(OnednnGemm(ta, false, r1 - r0, c1 - c0, k, o.a.data() + a_off, p.lda(), o.b.data() + c0,
                                 p.ldb(), 0.0f, serial.data() + c_off, n)
                          .ok());
        }
        Gemm(ta, false, r1 - r0, c1 - c0, k, 1.0f, o.af.data() + a_off, p.lda(), o.bf.data() + c0, p.ldb(), 0.0f,
             serial32.data() + c_off, n);
      }
      EXPECT_EQ(std::memcmp(pooled.data(), serial.data(), pooled.size() * sizeof(float)), 0);
      EXPECT_EQ(std::memcmp(pooled32.data(), serial32.data(), pooled32.size() * sizeof(float)), 0);
    }
  }
}

// STRATA_ONEDNN_F32=0's path, OpenBLAS, for the same float32 problems.
TEST(OnednnGemmTest, TheF32SwitchOffGivesOpenBlasTheSameProblems) {
  ScopedSwitch off(OnednnF32Switch(), false);
  EXPECT_FALSE(OnednnF32Gemm());
  for (bool ta : {false, true}) {
    const Problem p{ta, !ta, 200, 90, 70, 2};
    Check(p, /*integers=*/true, 1.0f, Path::kF32Panels, 0.5f);
    Check(p, /*integers=*/false, 0.0f, Path::kF32Panels);
  }
}

// The native paths follow the CPU (oneDNN's effective ISA, which
// ONEDNN_MAX_CPU_ISA caps): bf16 with AVX512_BF16 or AMX, f32 with AVX-512;
// off with their switches.
TEST(OnednnGemmTest, TheNativePathsFollowTheCpu) {
  const unsigned isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  auto has = [isa](dnnl_cpu_isa_t need) { return (isa & static_cast<unsigned>(need)) == static_cast<unsigned>(need); };
  {
    ScopedSwitch bf16(OnednnBf16Switch(), true);
    ScopedSwitch f32(OnednnF32Switch(), true);
    EXPECT_EQ(NativeBf16Gemm(), has(dnnl_cpu_isa_avx512_core_bf16));
    EXPECT_EQ(OnednnF32Gemm(), has(dnnl_cpu_isa_avx512_core));
    EXPECT_EQ(Bf16Here(), has(dnnl_cpu_isa_avx512_core));  // emulated without AVX512_BF16
  }
  ScopedSwitch bf16(OnednnBf16Switch(), false);
  ScopedSwitch f32(OnednnF32Switch(), false);
  EXPECT_FALSE(NativeBf16Gemm());
  EXPECT_FALSE(OnednnF32Gemm());
}

// A bf16 primitive refused for its scratchpad (the limit lowered to 1 byte
// here) leaves the GEMM to widened float copies: the same product, the
// refusal kept for the shape, and one note the run prints. The shapes are
// small enough for one call (no panels) and made by no other test.
TEST(OnednnGemmTest, ARefusedScratchpadRunsWidenedAndSaysSo) {
  // Only the native path reaches it (its brgemm kernels have scratchpads;
  // the emulated and missing ones: TheNativePathsFollowTheCpu).
  if (!NativeBf16Gemm()) return;
  const size_t before = MaxScratchpadBytes().exchange(1);
  std::optional<Problem> refused;
  for (bool ta : {true, false}) {
    for (auto [m, n, k] : {std::tuple<int64_t, int64_t, int64_t>{48, 80, 64}, {32, 96, 80}, {80, 48, 64}}) {
      const Problem p{ta, false, m, n, k, 0};
      absl::StatusOr<size_t> bytes =
          OnednnScratchpadBytes(false, p.ta, p.tb, p.m, p.n, p.k, p.lda(), p.ldb(), p.ldc(), 1.0f, 0.0f);
      if (bytes.ok()) {
        EXPECT_EQ(*bytes, 0u);  // below the 1-byte limit
        continue;
      }
      EXPECT_EQ(bytes.status().code(), absl::StatusCode::kResourceExhausted) << bytes.status();
      EXPECT_NE(bytes.status().message().find("-byte scratchpad for bf16 GEMM"), std::string::npos) << bytes.status();
      if (!refused) refused = p;
    }
  }
  MaxScratchpadBytes().store(before);
  ASSERT_TRUE(refused.has_value()) << "no small bf16 GEMM asked for a scratchpad to refuse";
  const Problem p = *refused;
  // Refused once, refused at every call (kept), whatever the limit now.
  Check(p, /*integers=*/true, 0.0f, Path::kBf16Panels);
  Check(p, /*integers=*/true, 1.0f, Path::kBf16Panels);
  Check(p, /*integers=*/false, 0.0f, Path::kBf16Panels);
  const std::string gemm = absl::StrCat("bf16 GEMM ", p.m, "x", p.n, "x", p.k);
  int found = 0;
  for (const std::string& line : GetCpuDevice()->KernelFallbacks(0)) {
    found += line.find(gemm) != std::string::npos &&
             line.find("it ran on widened float copies instead") != std::string::npos;
  }
  EXPECT_EQ(found, 1) << gemm;  // noted once for the three calls
}

TEST(OnednnGemmTest, EmptySizesScaleOrLeaveC) {
  std::vector<float> c = {1, 2, 3, 4};
  const bfloat16 one = ToBfloat16(1.0f);
  ASSERT_TRUE(GemmOrScale(false, false, 2, 2, 0, 1.0f, &one, 1, &one, 2, 0.5f, c.data(), 2).ok());
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1, 1.5f, 2}));
  ASSERT_TRUE(GemmOrScale(false, false, 2, 2, 0, 1.0f, &one, 1, &one, 2, 0.0f, c.data(), 2).ok());
  EXPECT_EQ(c, (std::vector<float>{0, 0, 0, 0}));
  c = {1, 2, 3, 4};
  ASSERT_TRUE(GemmOrScale(false, false, 0, 2, 5, 1.0f, &one, 5, &one, 2, 0.0f, c.data(), 2).ok());
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4}));
}

TEST(OnednnGemmTest, AnAlphaOtherThanOneIsAnError) {
  std::vector<float> c(4);
  const std::vector<bfloat16> x(4, ToBfloat16(1.0f));
  const absl::Status s = GemmOrScale(false, false, 2, 2, 2, 2.0f, x.data(), 2, x.data(), 2, 0.0f, c.data(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
}

// What a thread keeps beside the memory plan stays small at GPT-2 124M's
// shapes (8 x 1024 tokens, d 768, vocab 50257 unpadded and 50304 padded):
// every GEMM of its step whole and as two threads' row and column panels.
// A bf16 GEMM written into bf16 by oneDNN's gemm:jit kernel once kept a
// float copy of C there (785 MiB a thread for the logits); the kernels now
// take float outputs, and a primitive asking more than
// kMaxScratchpadBytes is refused.
TEST(OnednnGemmTest, ScratchpadsStaySmallAtGpt2Shapes) {
  struct Shape3 {
    bool ta, tb;
    int64_t m, n, k;
  };
  std::vector<Shape3> shapes;
  for (int64_t vocab : {50257, 50304}) {
    for (auto [n, k] : {std::pair<int64_t, int64_t>{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}, {vocab, 768}}) {
      shapes.push_back({false, false, 8192, n, k});  // forward, x @ W
      shapes.push_back({false, true, 8192, k, n});   // dx = dy @ W^T
      shapes.push_back({true, false, k, n, 8192});   // dW = x^T @ dy
      shapes.push_back({false, true, 8192, n, k});   // the tied head, x @ E^T
      shapes.push_back({true, false, n, k, 8192});   // its dE = dy^T @ x
      shapes.push_back({false, false, 4096, n, k});  // a row panel
      shapes.push_back({true, false, k, n / 2, 8192});  // a column panel
    }
  }
  size_t largest = 0;
  for (const Shape3& g : shapes) {
    for (bool f32 : {true, false}) {
      if (!f32 && !Bf16Here()) continue;  // Bf16Here checked oneDNN's answer
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(absl::StrCat(f32 ? "f32 " : "bf16 ", g.m, "x", g.n, "x", g.k, g.ta ? " ta" : "", g.tb ? " tb" : "",
                                  " beta ", beta));
        const int64_t lda = g.ta ? g.m : g.k, ldb = g.tb ? g.k : g.n;
        absl::StatusOr<size_t> bytes =
            OnednnScratchpadBytes(f32, g.ta, g.tb, g.m, g.n, g.k, lda, ldb, g.n, 1.0f, beta);
        ASSERT_TRUE(bytes.ok()) << bytes.status();
        EXPECT_LE(*bytes, size_t{4} << 20);
        largest = std::max(largest, *bytes);
      }
    }
  }
  // The query reads real primitives: the brgemm kernels the native paths
  // use have scratchpads (AVX2's f32 gemm:jit has none, and is not used).
  if (OnednnF32Gemm() || NativeBf16Gemm()) {
    EXPECT_GT(largest, size_t{0});
  }
}

}  // namespace
}  // namespace strata
