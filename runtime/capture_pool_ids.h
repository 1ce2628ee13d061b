#ifndef STRATA_RUNTIME_CAPTURE_POOL_IDS_H_
#define STRATA_RUNTIME_CAPTURE_POOL_IDS_H_

// The pool an allocator's BeginCapture(pool) captures into, shared by the
// caching allocator and the staging allocator (their pools differ, the ids
// do not): 0 asks for a new pool; an id returned before and not released
// shares that pool; any other id, a programmer error, gets a new pool with a
// warning; a BeginCapture during a capture goes on in the current pool.
// The caller holds the allocator's lock.

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"

namespace strata {

template <typename Pool>
int64_t ChooseCapturePool(const std::string& allocator, int64_t requested, int64_t capturing,
                          absl::flat_hash_map<int64_t, std::unique_ptr<Pool>>& pools, int64_t& next_id) {
  if (capturing != 0) {
    std::fprintf(stderr, "warning: %s: BeginCapture(%lld) while capturing into pool %lld; capture goes on there\n",
                 allocator.c_str(), static_cast<long long>(requested), static_cast<long long>(capturing));
    return capturing;
  }
  if (requested != 0) {
    auto it = pools.find(requested);
    if (it != pools.end() && !it->second->released) return requested;
    std::fprintf(stderr,
                 "warning: %s: BeginCapture(%lld): no such pool (never returned, or released); using a new pool\n",
                 allocator.c_str(), static_cast<long long>(requested));
  }
  const int64_t pool = next_id++;
  pools[pool] = std::make_unique<Pool>();
  return pool;
}

}  // namespace strata

#endif  // STRATA_RUNTIME_CAPTURE_POOL_IDS_H_
