#ifndef STRATA_PASSES_COMPILE_H_
#define STRATA_PASSES_COMPILE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/pass.h"
#include "proto/plan.pb.h"
#include "proto/program.pb.h"
#include "proto/strategy.pb.h"

namespace strata {

struct CompileOptions {
  int64_t batch_size = 0;       // global mini-batch (--batch_size); 0: derived or default
  std::string dump_after;       // keep the program after this pass (--dump_after)
  // The device the plans are for (--device): recorded in each plan, and the
  // memory plan counts that kind's kernel scratch.
  DeviceKind device_kind = DEVICE_CPU;
  // Optional passes (fusions: Pass::optional) to leave out, by name, so a
  // test can compare a program with and without one; naming a pass that is
  // not optional is an error.
  std::vector<std::string> disabled_passes;
  // Tests only: false makes mixed precision keep the float32 logits and their
  // casts before softmax_cross_entropy (the form before the loss read 16-bit
  // logits), to compare the two; no flag or strategy field sets it.
  bool mixed_precision_fold_losses = true;
};

struct CompileResult {
  std::vector<RankPlan> plans;  // one per rank
  // The program after options.dump_after, if named: for a pass that runs on
  // the whole program, `dumped`; for one that runs per rank, rank 0's there
  // and every rank's in `dumped_ranks` (index = rank).
  Program dumped;
  std::vector<Program> dumped_ranks;
  std::vector<std::string> pass_names;
  int64_t batch_size = 0;       // the global mini-batch the plans were made for
  PhaseTimes times;             // seconds per pass and phase, summed over ranks
};

// Checks a strategy against a validated program: sizes positive, checkpoint
// vars present, batch divisible. Errors name the field.
absl::Status ValidateStrategy(const Strategy& strategy, const Program& program, int64_t batch_size,
                              const std::string& strategy_file);

// Checks the passes a compile is asked to leave out (--disable_passes): each
// must be an optional pass (a fusion) that runs for `strategy` on `device`.
// The error names the pass, where it runs if not here, and the passes that
// may be left out here.
absl::Status CheckDisabledPasses(const Strategy& strategy, DeviceKind device,
                                 const std::vector<std::string>& disabled);

// The whole compiler: validate and infer, autodiff, recompute, optimizer,
// pipeline split, data parallel, gradient merge (the program passes, with the
// verifier between them), then per rank the schedule and the memory plan.
absl::StatusOr<CompileResult> Compile(const Program& program, const Strategy& strategy,
                                      const CompileOptions& options, const std::string& strategy_file = "strategy");

// A stable fingerprint of a set of plans (FNV-1a over their deterministic
// serialization); ranks compare it at rendezvous. Source positions (the
// `line` of vars and ops) are not part of what runs and are not hashed: a
// program that differs only in a comment has the same fingerprint. The plans
// are changed only while hashing.
std::string FingerprintPlans(std::vector<RankPlan>& plans);

// Default mini-batch when neither --batch_size nor a pipeline section says.
inline constexpr int64_t kDefaultBatchSize = 64;

}  // namespace strata

#endif  // STRATA_PASSES_COMPILE_H_
