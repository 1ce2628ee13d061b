#include "kernels/copy_plan.h"

#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

namespace strata {
namespace {

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) strides[d] = strides[d + 1] * shape[d + 1];
  return strides;
}

// What the GPU's general copy kernel does with a plan, on the host: for
// every row-major index of the box, its two offsets (in units of `unit`
// bytes), and one unit moved.
void RunPlan(const CopyPlan& p, int unit, char* dst, const char* src) {
  for (int64_t i = 0; i < p.count; ++i) {
    int64_t rest = i, d = 0, s = 0;
    for (int k = p.rank - 1; k >= 0; --k) {
      const int64_t index = rest % p.dims[k];
      rest /= p.dims[k];
      d += index * p.dst_strides[k];
      s += index * p.src_strides[k];
    }
    std::memcpy(dst + d * unit, src + s * unit, unit);
  }
}

// The launcher's steps on the host: merge, pick the chunk from the two
// addresses, widen, run. Returns the chunk it used.
int CopyLikeTheLauncher(int rank, const int64_t* box, const int64_t* dst_strides, const int64_t* src_strides,
                        int element_size, char* dst, const char* src) {
  CopyPlan plan;
  EXPECT_TRUE(MakeCopyPlan(rank, box, dst_strides, src_strides, &plan));
  const int chunk = CopyChunkBytes(plan, element_size, reinterpret_cast<uintptr_t>(dst),
                                   reinterpret_cast<uintptr_t>(src));
  RunPlan(WidenCopyPlan(plan, element_size, chunk), chunk, dst, src);
  return chunk;
}

// Buffers aligned to 16 bytes whatever the offset asked of them.
struct Aligned {
  explicit Aligned(size_t bytes) : storage(bytes / 16 + 2) {}
  char* at(size_t byte_offset) { return reinterpret_cast<char*>(storage.data()) + byte_offset; }
  std::vector<std::array<uint64_t, 2>> storage;
};

// A transpose of `shape` by `perm` of 2-byte elements, through the plan and
// directly; returns the chunk the plan used.
int CheckTranspose16(const std::vector<int64_t>& shape, const std::vector<int>& perm) {
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> out(rank);
  for (int k = 0; k < rank; ++k) out[k] = shape[perm[k]];
  const std::vector<int64_t> x_stride = RowMajorStrides(shape), y_stride = RowMajorStrides(out);
  std::vector<int64_t> step(rank);
  for (int k = 0; k < rank; ++k) step[k] = x_stride[perm[k]];
  const int64_t n = std::accumulate(shape.begin(), shape.end(), int64_t{1}, std::multiplies<int64_t>());
  Aligned x_buf(n * 2), y_buf(n * 2);
  auto* x = reinterpret_cast<uint16_t*>(x_buf.at(0));
  auto* y = reinterpret_cast<uint16_t*>(y_buf.at(0));
  for (int64_t i = 0; i < n; ++i) x[i] = static_cast<uint16_t>(i * 2654435761u >> 7);
  const int chunk = CopyLikeTheLauncher(rank, out.data(), y_stride.data(), step.data(), 2, y_buf.at(0), x_buf.at(0));
  for (int64_t o = 0; o < n; ++o) {
    int64_t rest = o, src = 0;
    for (int k = rank - 1; k >= 0; --k) {
      src += rest % out[k] * step[k];
      rest /= out[k];
    }
    if (y[o] != x[src]) {
      ADD_FAILURE() << "element " << o << " of the transpose";
      break;
    }
  }
  return chunk;
}

TEST(CopyPlanTest, MergesDimsContiguousInBothSidesAndDropsOnes) {
  // GPT-2's q: [8, 1024, 12, 64] -> [8, 12, 1024, 64] (perm 0 2 1 3).
  const int64_t box[] = {8, 12, 1024, 64};
  const int64_t dst[] = {12 * 1024 * 64, 1024 * 64, 64, 1};
  const int64_t src[] = {1024 * 12 * 64, 64, 12 * 64, 1};
  CopyPlan plan;
  ASSERT_TRUE(MakeCopyPlan(4, box, dst, src, &plan));
  EXPECT_EQ(plan.rank, 4);
  EXPECT_EQ(plan.count, 8 * 12 * 1024 * 64);
  // A slice of whole rows: [1, 4, 6] of a [1, 4, 10] at column 2.
  const int64_t rows[] = {1, 4, 6}, rows_dst[] = {24, 6, 1}, rows_src[] = {40, 10, 1};
  ASSERT_TRUE(MakeCopyPlan(3, rows, rows_dst, rows_src, &plan));
  EXPECT_EQ(plan.rank, 2);
  EXPECT_EQ(plan.dims[0], 4);
  EXPECT_EQ(plan.dims[1], 6);
  // Contiguous in both: one dim.
  const int64_t whole[] = {3, 5}, whole_strides[] = {5, 1};
  ASSERT_TRUE(MakeCopyPlan(2, whole, whole_strides, whole_strides, &plan));
  EXPECT_EQ(plan.rank, 1);
  EXPECT_EQ(plan.dims[0], 15);
  const int64_t empty[] = {3, 0};
  ASSERT_TRUE(MakeCopyPlan(2, empty, whole_strides, whole_strides, &plan));
  EXPECT_EQ(plan.count, 0);
}

TEST(CopyPlanTest, RefusesMoreDimsThanTheKernelsTake) {
  std::vector<int64_t> box(kMaxCopyDims + 1, 2), dst(kMaxCopyDims + 1), src(kMaxCopyDims + 1);
  // Alternate which side is contiguous so no two dims merge.
  for (int d = 0; d <= kMaxCopyDims; ++d) {
    dst[d] = int64_t{1} << d;
    src[d] = int64_t{1} << (kMaxCopyDims - d);
  }
  CopyPlan plan;
  EXPECT_FALSE(MakeCopyPlan(kMaxCopyDims + 1, box.data(), dst.data(), src.data(), &plan));
}

TEST(CopyPlanTest, Bf16HeadTransposesMoveSixteenBytesAThreadAndStayExact) {
  // q, k, v into heads and the attention output back: D = 64 contiguous.
  EXPECT_EQ(CheckTranspose16({2, 16, 3, 64}, {0, 2, 1, 3}), 16);
  EXPECT_EQ(CheckTranspose16({2, 3, 16, 64}, {0, 2, 1, 3}), 16);
  // Heads of 4 elements (8 bytes): 8-byte chunks.
  EXPECT_EQ(CheckTranspose16({2, 5, 3, 4}, {0, 2, 1, 3}), 8);
  // An odd last dim: element by element.
  EXPECT_EQ(CheckTranspose16({2, 5, 3, 3}, {0, 2, 1, 3}), 2);
  // A transpose of the last two dims has no contiguous run (the tiled kernel's case).
  EXPECT_EQ(CheckTranspose16({3, 17, 40}, {0, 2, 1}), 2);
}

TEST(CopyPlanTest, ChunksFollowTheBaseAddressesAndTheOuterStrides) {
  // split of a [4, 24] bf16 tensor into columns [0, 8), [8, 16), [16, 24) and [0, 3) etc.:
  // each part's source starts at its column's byte offset.
  const int64_t n = 4 * 24;
  Aligned whole_buf(n * 2);
  auto* whole = reinterpret_cast<uint16_t*>(whole_buf.at(0));
  for (int64_t i = 0; i < n; ++i) whole[i] = static_cast<uint16_t>(1000 + i);
  const int64_t whole_strides[] = {24, 1};
  struct Case {
    int64_t first, width;
    int chunk;
  };
  // Offsets of 8 elements keep 16-byte alignment; 4 keep 8; 1 keeps 2; a
  // width of 12 with 16-byte alignment takes 8 (12 is not a multiple of 8).
  for (const Case& c : {Case{0, 8, 16}, Case{8, 8, 16}, Case{16, 8, 16}, Case{4, 8, 8}, Case{1, 6, 2},
                        Case{0, 12, 8}, Case{12, 12, 8}}) {
    const int64_t box[] = {4, c.width}, part_strides[] = {c.width, 1};
    Aligned part_buf(4 * c.width * 2);
    const int chunk = CopyLikeTheLauncher(2, box, part_strides, whole_strides, 2, part_buf.at(0),
                                          whole_buf.at(c.first * 2));
    EXPECT_EQ(chunk, c.chunk) << "columns from " << c.first << ", " << c.width << " wide";
    const auto* part = reinterpret_cast<const uint16_t*>(part_buf.at(0));
    for (int64_t r = 0; r < 4; ++r) {
      for (int64_t col = 0; col < c.width; ++col) {
        ASSERT_EQ(part[r * c.width + col], whole[r * 24 + c.first + col]) << r << ", " << col;
      }
    }
  }
}

TEST(CopyPlanTest, WideElementsWidenToo) {
  // F32 and I64 rows of 8 elements: 16-byte chunks of 4 and 2 elements.
  const int64_t box[] = {3, 2, 8}, dst[] = {16, 8, 1}, src[] = {8, 24, 1};
  CopyPlan plan;
  ASSERT_TRUE(MakeCopyPlan(3, box, dst, src, &plan));
  EXPECT_EQ(CopyChunkBytes(plan, 4, 0, 0), 16);
  EXPECT_EQ(CopyChunkBytes(plan, 8, 0, 0), 16);
  const CopyPlan wide = WidenCopyPlan(plan, 4, 16);
  ASSERT_EQ(wide.rank, 3);
  EXPECT_EQ(wide.dims[2], 2);
  EXPECT_EQ(wide.count, plan.count / 4);
  EXPECT_EQ(wide.dst_strides[0], 4);
  EXPECT_EQ(wide.src_strides[1], 6);
  // An 8-byte element at an address 8 past a 16-byte boundary: no chunk wider than the element.
  EXPECT_EQ(CopyChunkBytes(plan, 8, 8, 0), 8);
  // An outer stride of 18 floats: 16-byte chunks (4 floats) do not divide it, 8-byte ones do.
  const int64_t odd_src[] = {8, 18, 1};
  ASSERT_TRUE(MakeCopyPlan(3, box, dst, odd_src, &plan));
  EXPECT_EQ(CopyChunkBytes(plan, 4, 0, 0), 8);
}

// A run that widens to one chunk joins the dim outside it: no size-1 dims
// are left for the tiled transpose to mistake for a transpose (a concat of
// [N, 8] bf16 parts into [N, 16] is N chunks 2 apart, read 1 apart).
TEST(CopyPlanTest, WideningMergesARunOfOneChunk) {
  const int64_t box[] = {5, 8}, dst[] = {16, 1}, src[] = {8, 1};
  CopyPlan plan;
  ASSERT_TRUE(MakeCopyPlan(2, box, dst, src, &plan));
  ASSERT_EQ(CopyChunkBytes(plan, 2, 0, 0), 16);
  const CopyPlan wide = WidenCopyPlan(plan, 2, 16);
  ASSERT_EQ(wide.rank, 1);
  EXPECT_EQ(wide.dims[0], 5);
  EXPECT_EQ(wide.dst_strides[0], 2);
  EXPECT_EQ(wide.src_strides[0], 1);
  EXPECT_EQ(wide.count, 5);
  // And the copy is right.
  Aligned whole(5 * 16 * 2), part(5 * 8 * 2);
  auto* p = reinterpret_cast<uint16_t*>(part.at(0));
  for (int i = 0; i < 40; ++i) p[i] = static_cast<uint16_t>(7 * i + 1);
  EXPECT_EQ(CopyLikeTheLauncher(2, box, dst, src, 2, whole.at(0), part.at(0)), 16);
  const auto* w = reinterpret_cast<const uint16_t*>(whole.at(0));
  for (int r = 0; r < 5; ++r) {
    for (int c = 0; c < 8; ++c) ASSERT_EQ(w[r * 16 + c], p[r * 8 + c]) << r << ", " << c;
  }
}

TEST(CopyPlanTest, Int32IndexingOnlyWhereEveryOffsetFits) {
  const int64_t small[] = {8, 12, 1024, 64}, small_dst[] = {786432, 65536, 64, 1}, small_src[] = {786432, 64, 768, 1};
  CopyPlan plan;
  ASSERT_TRUE(MakeCopyPlan(4, small, small_dst, small_src, &plan));
  EXPECT_TRUE(CopyPlanFitsInt32(plan));
  // GPT-2's logits at 4 x 8192 tokens (32768 x 50257, 1.6e9 elements) transposed: over 2^30.
  const int64_t logits[] = {32768, 50257}, logits_dst[] = {50257, 1}, logits_src[] = {1, 32768};
  ASSERT_TRUE(MakeCopyPlan(2, logits, logits_dst, logits_src, &plan));
  EXPECT_FALSE(CopyPlanFitsInt32(plan));
  // Few elements, but the source's last offset is far: a slice of a huge tensor.
  const int64_t far[] = {2, 4}, far_dst[] = {4, 1}, far_src[] = {int64_t{1} << 31, 1};
  ASSERT_TRUE(MakeCopyPlan(2, far, far_dst, far_src, &plan));
  EXPECT_FALSE(CopyPlanFitsInt32(plan));
  // A negative stride (none of the callers makes one): not assumed to fit.
  CopyPlan backwards;
  backwards.rank = 1;
  backwards.dims[0] = 4;
  backwards.dst_strides[0] = 1;
  backwards.src_strides[0] = -1;
  backwards.count = 4;
  EXPECT_FALSE(CopyPlanFitsInt32(backwards));
}

}  // namespace
}  // namespace strata
