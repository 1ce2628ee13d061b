// What every training process of `strata run` does, on one device or as a
// worker: its TrainOptions from the flags, stopping on SIGTERM, the summary.

#ifndef STRATA_TOOLS_TRAINING_PROCESS_H_
#define STRATA_TOOLS_TRAINING_PROCESS_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "runtime/trainer.h"

namespace strata {
namespace cli {

// The run flags as TrainOptions; --seed, when given, overrides the program's seed.
TrainOptions TrainOptionsFromFlags(uint64_t program_seed);

// The run's last lines: time, measured and predicted memory, the final loss.
void PrintSummary(const TrainReport& report);

// Synthetic data is the default so that `strata run PROGRAM` is a smoke test;
// say so (TrainOptions::notes, once the data has opened), lest a user
// take its loss for their dataset's. "" with --data or --quiet.
std::string SyntheticDataNote(const std::set<std::string>& given);

// The notes a run says before its first step (TrainOptions::notes): the
// synthetic-data note, where it applies.
std::vector<std::string> RunNotes(const std::set<std::string>& given);

// A training process (one device, or a worker) stops at the next step
// boundary on SIGTERM, every rank after the same step, and saves with --save:
// a cluster's preemption (the launcher forwards it to the workers).
void InstallStopHandler();

// How a run that a stop request ended reports it: the step, what it saved,
// and 128 + the signal as the exit code, as a process killed by it would.
int ReportStopped(const TrainReport& report);

}  // namespace cli
}  // namespace strata

#endif  // STRATA_TOOLS_TRAINING_PROCESS_H_
