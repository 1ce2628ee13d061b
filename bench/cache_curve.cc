// bench/cache_curve: how fast this machine streams a buffer it reads over
// and over, by buffer size. A diagnostic with no goal, for reading the
// compile-time scaling figures: a pass walks the program again and again,
// and the walk slows by the byte once the program no longer fits the cache
// that is effectively there (less than the L3 that lscpu reports on a shared
// VM). Formula: buffer bytes x passes / seconds, with one 8-byte load per
// 64-byte line (every line of the buffer is brought in each pass).
//
//   bazel run //bench:cache_curve -- [--rounds=2]

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "bench/bench_util.h"

int main(int argc, char** argv) {
  const int64_t rounds = strata::bench::IntFlag(argc, argv, "rounds", 2);
  std::printf("%8s %s\n", "MiB", "GB/s of repeated sequential reads, one column per round");
  for (int64_t mib : {2, 4, 8, 12, 16, 20, 24, 32, 48, 64}) {
    std::printf("%8lld", static_cast<long long>(mib));
    for (int64_t r = 0; r < rounds; ++r) {
      const size_t n = static_cast<size_t>(mib) * (1 << 20) / sizeof(uint64_t);
      std::vector<uint64_t> buffer(n, 1);
      uint64_t sum = 0;
      for (size_t i = 0; i < n; i += 8) sum += buffer[i];  // warm
      const int passes = static_cast<int>(std::max<int64_t>(4, 512 / mib));
      const auto t0 = std::chrono::steady_clock::now();
      for (int p = 0; p < passes; ++p) {
        for (size_t i = 0; i < n; i += 8) sum += buffer[i];
      }
      const double ns = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      // The sum is checked so the loads are not optimized away.
      if (sum != (passes + 1) * (n / 8)) {
        std::fprintf(stderr, "cache_curve: validation failed\n");
        return 1;
      }
      std::printf(" %7.1f", passes * n * sizeof(uint64_t) / ns);
    }
    std::printf("\n");
  }
  return 0;
}
