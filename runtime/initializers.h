#ifndef STRATA_RUNTIME_INITIALIZERS_H_
#define STRATA_RUNTIME_INITIALIZERS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/program.pb.h"
#include "runtime/allocator.h"
#include "runtime/tensor.h"

namespace strata {

// The initial value of a persistent var (a PARAM's weights, zeros for optimizer
// state), from its `init` (proto/program.proto Initializer; absent: zeros).
//
// Values depend only on (seed, var.name()) -- never on creation order, rank or
// layout -- so every parallel layout starts from the same weights. Element i
// draws from Philox keyed by MixKey(seed, Fnv1a64(name)) at counter i / 4,
// lane i % 4; normals come from Box-Muller over the four lanes of a block.
// Values are computed in double and rounded to F32 on store.
//
// Fans (xavier, kaiming): a 2-D weight is [in, out] (y = x @ W); a conv filter
// [O, C, kh, kw] has fan_in C*kh*kw and fan_out O*kh*kw; 1-D: both shape[0].
//
// InvalidArgument (naming the var) for a shape with a negative (batch)
// dimension, a random initializer on a non-float dtype, or bad values
// (std < 0, low > high, negative gain, non-finite numbers, xavier/kaiming on a scalar).
absl::StatusOr<Tensor> InitializeParam(const Var& var, uint64_t seed, Allocator* allocator = GetCpuAllocator());

}  // namespace strata

#endif  // STRATA_RUNTIME_INITIALIZERS_H_
