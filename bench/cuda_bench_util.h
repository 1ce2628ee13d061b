#ifndef STRATA_BENCH_CUDA_BENCH_UTIL_H_
#define STRATA_BENCH_CUDA_BENCH_UTIL_H_

// What the GPU kernel benchmarks (attention_bench, layer_norm_bench) share:
// one "error: NAME: ..." line on stderr and exit 1 on a failure, and
// device buffers that end the run when they cannot be had.

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace strata::bench {

// The benchmark's name in its error lines (set once by main).
inline const char*& BenchName() {
  static const char* name = "bench";
  return name;
}

[[noreturn]] inline void Fail(const std::string& what) {
  std::fprintf(stderr, "error: %s: %s\n", BenchName(), what.c_str());
  std::exit(1);
}

inline void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Fail(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

// n elements of T on the device (at least one), or the run ends.
template <typename T>
T* DeviceBuffer(int64_t n) {
  void* p = nullptr;
  Check(cudaMalloc(&p, std::max<int64_t>(n, 1) * sizeof(T)), "cudaMalloc");
  return static_cast<T*>(p);
}

}  // namespace strata::bench

#endif  // STRATA_BENCH_CUDA_BENCH_UTIL_H_
