#include "kernels/multi_tensor_table.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace strata {
namespace {

// Runs ForEachTensorTable over tensors of `sizes` and walks every block of
// every launch as the CUDA kernels do (TensorOfBlock, ChunkOfBlock),
// counting how often each element of each tensor is visited.
struct Walk {
  std::vector<std::vector<int>> visits;  // per tensor, per element
  std::vector<int> tensors_per_launch;
  bool pointers_match = true;
};

Walk WalkTables(const std::vector<int64_t>& sizes) {
  Walk w;
  const int count = static_cast<int>(sizes.size());
  std::vector<std::vector<float>> a(count), b(count);
  std::vector<const float*> pa(count), pb(count);
  for (int i = 0; i < count; ++i) {
    w.visits.emplace_back(sizes[i], 0);
    a[i].resize(sizes[i] + 1);
    b[i].resize(sizes[i] + 1);
    pa[i] = a[i].data();
    pb[i] = b[i].data();
  }
  const float* const* lists[2] = {pa.data(), pb.data()};
  const int r =
      ForEachTensorTable<float, 2>(lists, sizes.data(), count, [&](const TensorTable<float, 2>& t, int64_t blocks) {
        w.tensors_per_launch.push_back(t.count);
        for (int64_t block = 0; block < blocks; ++block) {
          const int k = TensorOfBlock(t, block);
          int64_t lo, hi;
          ChunkOfBlock(t, k, block, &lo, &hi);
          // Which tensor is this? Its param pointer says.
          int i = 0;
          while (i < count && pa[i] != t.ptr[0][k]) ++i;
          if (i == count || pb[i] != t.ptr[1][k] || t.n[k] != sizes[i]) {
            w.pointers_match = false;
            continue;
          }
          EXPECT_LT(lo, hi) << "an empty block";
          for (int64_t e = lo; e < hi; ++e) ++w.visits[i][e];
        }
        return 0;
      });
  EXPECT_EQ(r, 0);
  return w;
}

void ExpectEveryElementOnce(const Walk& w) {
  EXPECT_TRUE(w.pointers_match);
  for (size_t i = 0; i < w.visits.size(); ++i) {
    for (size_t e = 0; e < w.visits[i].size(); ++e) {
      ASSERT_EQ(w.visits[i][e], 1) << "tensor " << i << " element " << e;
    }
  }
}

TEST(MultiTensorTable, EveryElementOfEveryTensorOnceInOneLaunch) {
  const Walk w = WalkTables({37 * 29, kMultiTensorChunk, kMultiTensorChunk + 1, 3 * kMultiTensorChunk - 1, 1, 0, 5});
  ExpectEveryElementOnce(w);
  EXPECT_EQ(w.tensors_per_launch, (std::vector<int>{6}));  // the empty one takes no place
}

TEST(MultiTensorTable, SplitsIntoLaunchesOf64Tensors) {
  std::vector<int64_t> sizes;
  for (int i = 0; i < 150; ++i) sizes.push_back(1 + 997 * i);  // GPT-2 124M has about 150 parameter tensors
  const Walk w = WalkTables(sizes);
  ExpectEveryElementOnce(w);
  EXPECT_EQ(w.tensors_per_launch, (std::vector<int>{64, 64, 22}));
}

TEST(MultiTensorTable, NoTensorsNoLaunch) {
  EXPECT_TRUE(WalkTables({}).tensors_per_launch.empty());
  EXPECT_TRUE(WalkTables({0, 0}).tensors_per_launch.empty());
}

TEST(MultiTensorTable, AFailedLaunchStopsAndIsReturned) {
  std::vector<int64_t> sizes(130, 10);
  std::vector<float> x(10);
  std::vector<const float*> p(130, x.data());
  const float* const* lists[1] = {p.data()};
  int launches = 0;
  const int r = ForEachTensorTable<float, 1>(
      lists, sizes.data(), 130, [&](const TensorTable<float, 1>&, int64_t) { return ++launches == 2 ? 7 : 0; });
  EXPECT_EQ(r, 7);
  EXPECT_EQ(launches, 2);
}

}  // namespace
}  // namespace strata
