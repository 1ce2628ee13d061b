// strided_copy.cu, launchers included, on the CPU: the genrule
// strided_copy_emulated_src rewrites its <<<>>> launches into calls of
// testing/cuda_stand_in/'s Launch, and g++ compiles it against the stand-ins
// (blocks one after another, a block's CUDA threads as fibers). Each copy runs
// through LaunchStridedCopy as a GPU plan would call it, against a direct
// host copy of the box element by element: every byte of dst, inside the box
// and around it, must match. Covers element sizes 1, 2, 4 and 8, the chunked
// copies (a bf16 [B, T, H, D] -> [B, H, T, D] with D = 64 moves 16 bytes a
// thread), the tiled transpose of the last two dims, concat and split boxes at
// aligned and misaligned offsets, negative strides (the 64-bit kernel) and
// LaunchStridedScale. It checks the launchers' dispatch and launch shapes and
// the kernels' indexing, not the hardware's timing or coalescing.

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/copy_plan.h"
#include "kernels/cuda/strided_copy.h"
#include "kernels/cuda/testing/cuda_stand_in/cuda_stand_in.h"
#include "kernels/cuda/testing/emulation_test_util.h"

namespace strata {
namespace cuda {
namespace {

// A byte buffer whose first byte is 256-byte aligned (as cudaMalloc's).
class Buffer {
 public:
  explicit Buffer(size_t bytes) : storage_(bytes + 256) {
    const auto address = reinterpret_cast<uintptr_t>(storage_.data());
    base_ = storage_.data() + (256 - address % 256) % 256;
    size_ = bytes;
  }
  unsigned char* data() { return base_; }
  size_t size() const { return size_; }
  std::vector<unsigned char> Bytes() const { return std::vector<unsigned char>(base_, base_ + size_); }

 private:
  std::vector<unsigned char> storage_;
  unsigned char* base_;
  size_t size_;
};

struct Box {
  std::vector<int64_t> dims, dst_strides, src_strides;  // strides in elements
  int64_t dst_offset = 0, src_offset = 0;              // elements, from the buffers' starts
  int64_t dst_elements = 0, src_elements = 0;          // buffer sizes
};

// Row-major strides of dims.
std::vector<int64_t> Contiguous(const std::vector<int64_t>& dims) {
  std::vector<int64_t> s(dims.size(), 1);
  for (int d = static_cast<int>(dims.size()) - 2; d >= 0; --d) s[d] = s[d + 1] * dims[d + 1];
  return s;
}
int64_t Count(const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Runs the box's copy of `es`-byte elements through LaunchStridedCopy and
// compares all of dst with the host copy; returns the plan's chunk bytes.
int CheckCopy(const Box& b, int es, uint32_t seed = 1) {
  Buffer src(b.src_elements * es), dst(b.dst_elements * es);
  std::mt19937 rng(seed);
  for (size_t i = 0; i < src.size(); ++i) src.data()[i] = static_cast<unsigned char>(rng());
  std::memset(dst.data(), 0xab, dst.size());
  std::vector<unsigned char> want = dst.Bytes();
  const int rank = static_cast<int>(b.dims.size());
  std::vector<int64_t> index(rank, 0);
  for (int64_t n = Count(b.dims), i = 0; i < n; ++i) {
    int64_t rest = i, d_off = b.dst_offset, s_off = b.src_offset;
    for (int d = rank - 1; d >= 0; --d) {
      const int64_t k = rest % b.dims[d];
      rest /= b.dims[d];
      d_off += k * b.dst_strides[d];
      s_off += k * b.src_strides[d];
    }
    std::memcpy(&want[d_off * es], src.data() + s_off * es, es);
  }
  CopyPlan plan;
  EXPECT_TRUE(MakeCopyPlan(rank, b.dims.data(), b.dst_strides.data(), b.src_strides.data(), &plan));
  unsigned char* d = dst.data() + b.dst_offset * es;
  const unsigned char* s = src.data() + b.src_offset * es;
  const int64_t launches = cuda_stand_in::launches;
  EXPECT_EQ(LaunchStridedCopy(d, s, es, plan, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cuda_stand_in::launches, launches + 1);
  EXPECT_EQ(cuda_stand_in::errors.load(), 0);
  const std::vector<unsigned char> got = dst.Bytes();
  size_t wrong = 0, first = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i] && wrong++ == 0) first = i;
  }
  EXPECT_EQ(wrong, 0u) << "bytes differ, first at byte " << first << " (element " << first / es << ")";
  return CopyChunkBytes(plan, es, reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(s));
}

// x [dims] to y = x transposed by perm (y's dim k is x's dim perm[k]).
Box Transpose(const std::vector<int64_t>& x_dims, const std::vector<int>& perm) {
  Box b;
  const std::vector<int64_t> x_strides = Contiguous(x_dims);
  for (int p : perm) {
    b.dims.push_back(x_dims[p]);
    b.src_strides.push_back(x_strides[p]);
  }
  b.dst_strides = Contiguous(b.dims);
  b.dst_elements = b.src_elements = Count(x_dims);
  return b;
}

// Part [R, c] at column `at` of whole [R, C]: concat (into the whole) or split (out of it).
Box Part(int64_t R, int64_t C, int64_t at, int64_t c, bool concat) {
  Box b;
  b.dims = {R, c};
  const std::vector<int64_t> whole = {C, 1}, part = {c, 1};
  b.dst_strides = concat ? whole : part;
  b.src_strides = concat ? part : whole;
  (concat ? b.dst_offset : b.src_offset) = at;
  b.dst_elements = concat ? R * C : R * c;
  b.src_elements = concat ? R * c : R * C;
  return b;
}

TEST(StridedCopyEmulation, AttentionHeadsTransposeMovesSixteenBytes) {
  // [B, T, H, D] -> [B, H, T, D], bf16 with D = 64: 16-byte chunks.
  EXPECT_EQ(CheckCopy(Transpose({2, 5, 3, 64}, {0, 2, 1, 3}), 2), 16);
  // And back.
  EXPECT_EQ(CheckCopy(Transpose({2, 3, 5, 64}, {0, 2, 1, 3}), 2), 16);
  // f32 with D = 64, f64 with D = 2: also 16.
  EXPECT_EQ(CheckCopy(Transpose({2, 5, 3, 64}, {0, 2, 1, 3}), 4), 16);
  EXPECT_EQ(CheckCopy(Transpose({2, 5, 3, 2}, {0, 2, 1, 3}), 8), 16);
}

TEST(StridedCopyEmulation, TransposesKeepingTheLastDimEveryElementSize) {
  for (int es : {1, 2, 4, 8}) {
    SCOPED_TRACE(es);
    CheckCopy(Transpose({2, 5, 3, 3}, {0, 2, 1, 3}), es);   // odd D: element chunks
    CheckCopy(Transpose({3, 4, 2, 6}, {2, 0, 1, 3}), es);   // D = 6: 2-element chunks where they divide
    CheckCopy(Transpose({4, 3, 5, 8}, {1, 2, 0, 3}), es);
  }
}

TEST(StridedCopyEmulation, LastTwoDimsTransposeTakesTheTiles) {
  for (int es : {1, 2, 4, 8}) {
    SCOPED_TRACE(es);
    // Not multiples of the 32 x 32 tile; with and without outer dims.
    const Box b = Transpose({2, 37, 45}, {0, 2, 1});
    CopyPlan plan;
    ASSERT_TRUE(MakeCopyPlan(3, b.dims.data(), b.dst_strides.data(), b.src_strides.data(), &plan));
    ASSERT_EQ(plan.dst_strides[plan.rank - 1], 1);
    ASSERT_EQ(plan.src_strides[plan.rank - 2], 1);  // the tiled kernel's case
    CheckCopy(b, es);
    CheckCopy(Transpose({64, 33}, {1, 0}), es);
    CheckCopy(Transpose({5, 7}, {1, 0}), es);
    CheckCopy(Transpose({3, 2, 31, 65}, {1, 0, 3, 2}), es);
    // A full transpose of a rank-3 tensor: dims reversed.
    CheckCopy(Transpose({6, 5, 40}, {2, 1, 0}), es);
  }
}

TEST(StridedCopyEmulation, ConcatAndSplitAtAlignedAndMisalignedOffsets) {
  for (int es : {1, 2, 4, 8}) {
    for (bool concat : {true, false}) {
      SCOPED_TRACE(testing::Message() << es << " bytes, " << (concat ? "concat" : "split"));
      CheckCopy(Part(6, 48, 0, 16, concat), es);   // aligned: wide chunks
      CheckCopy(Part(6, 48, 16, 32, concat), es);
      CheckCopy(Part(6, 48, 8, 8, concat), es);    // [N, 8] parts: for bf16 one chunk a row
      CheckCopy(Part(5, 24, 3, 5, concat), es);    // misaligned
      CheckCopy(Part(5, 24, 7, 17, concat), es);
      CheckCopy(Part(1, 9, 1, 8, concat), es);     // one row, offset by one element
    }
  }
  // The bf16 [N, 8] parts of an [N, 16] concat: one dim of N 16-byte chunks.
  EXPECT_EQ(CheckCopy(Part(6, 16, 8, 8, true), 2), 16);
}

TEST(StridedCopyEmulation, NegativeStridesTakeTheWideIndexKernel) {
  for (int es : {1, 2, 4, 8}) {
    SCOPED_TRACE(es);
    Box b;  // y[i, j] = x[R - 1 - i, j] of [R, C]: the rows reversed
    b.dims = {7, 5};
    b.dst_strides = {5, 1};
    b.src_strides = {-5, 1};
    b.src_offset = 6 * 5;
    b.dst_elements = b.src_elements = 35;
    CheckCopy(b, es);
  }
}

TEST(StridedCopyEmulation, RefusesOtherElementSizesAndSkipsEmptyBoxes) {
  CopyPlan plan;
  const int64_t dims[] = {4}, strides[] = {1};
  ASSERT_TRUE(MakeCopyPlan(1, dims, strides, strides, &plan));
  unsigned char a[64] = {}, b[64] = {};
  EXPECT_EQ(LaunchStridedCopy(a, b, 3, plan, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(LaunchStridedCopy(a, b, 16, plan, nullptr), cudaErrorInvalidValue);
  const int64_t empty[] = {0};
  ASSERT_TRUE(MakeCopyPlan(1, empty, strides, strides, &plan));
  const int64_t launches = cuda_stand_in::launches;
  EXPECT_EQ(LaunchStridedCopy(a, b, 4, plan, nullptr), cudaSuccess);
  EXPECT_EQ(cuda_stand_in::launches, launches);
}

template <typename T>
void CheckScale() {
  // broadcast_like: y [4, 3, 5] = x [4, 1, 5] repeated along dim 1, times 0.3.
  const std::vector<int64_t> dims = {4, 3, 5}, dst = Contiguous(dims), src = {5, 0, 1};
  std::vector<T> x(20), y(60 + 4, T(-7)), want(64, T(-7));
  std::mt19937 rng(3);
  std::uniform_real_distribution<double> u(-2, 2);
  for (T& v : x) v = static_cast<T>(u(rng));
  const T factor = static_cast<T>(0.3);
  for (int a = 0; a < 4; ++a) {
    for (int b = 0; b < 3; ++b) {
      for (int c = 0; c < 5; ++c) want[a * 15 + b * 5 + c] = x[a * 5 + c] * factor;
    }
  }
  CopyPlan plan;
  ASSERT_TRUE(MakeCopyPlan(3, dims.data(), dst.data(), src.data(), &plan));
  ASSERT_EQ(LaunchStridedScale(y.data(), x.data(), factor, plan, nullptr), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  for (size_t i = 0; i < y.size(); ++i) {
    EXPECT_EQ(std::memcmp(&y[i], &want[i], sizeof(T)), 0) << i << ": " << y[i] << " vs " << want[i];
  }
}

TEST(StridedCopyEmulation, ScaleFloatAndDouble) {
  CheckScale<float>();
  CheckScale<double>();
  EXPECT_EQ(cuda_stand_in::errors.load(), 0);
}

}  // namespace
}  // namespace cuda
}  // namespace strata
