#ifndef STRATA_ANALYSIS_SAMPLE_FORMS_H_
#define STRATA_ANALYSIS_SAMPLE_FORMS_H_

// How each value of a user's program depends on the samples of its batch.
//
// Pipeline micro-batches, data-parallel replicas and gradient merge all
// split a batch into parts, run the program on each part and combine the
// parts' losses and gradients. Averaging them equals one device's step on
// the whole batch exactly when the loss is a mean over samples of per-sample
// terms (plus anything that does not depend on the data): the average of the
// parts' means is the whole batch's mean. Adding them up does for a sum over
// samples. A sum plus a constant combines neither way, and a loss that lets
// samples interact (a softmax along the batch axis, a batch statistic fed
// through a nonlinearity) changes with the split. The compiler proves the
// form from the ops' shapes and attrs before it splits anything
// (passes/compile.cc).

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/program.pb.h"

namespace strata {

enum class SampleForm {
  kConstant,   // independent of the batch's data (params, constants)
  kPerSample,  // carries the batch dim (-1), whose entry i is sample i's alone
  kMean,       // an affine function of means over samples of per-sample terms
  kSum,        // a linear function of sums over samples of per-sample terms
               // (plus constants: still not a mean)
  kMixed,      // anything else: samples interact
};

struct VarSampleForm {
  SampleForm form = SampleForm::kConstant;
  // kMean, kSum, kMixed: where the op that made the form is ("file:line: op
  // #i 'type'"), and for kMixed why the samples meet there.
  std::string origin;
  std::string why;
  // kSum: plus a constant (a bias, a parameter's sum). Such a sum neither
  // averages nor adds up over a split batch's parts: their total counts the
  // constant once per part. Where the constant joined, "file:line: op #i".
  std::string offset_at;
};

// The form of every var of a validated program (ValidateAndInferProgram), by
// the var's index in program.var().
std::vector<VarSampleForm> SampleForms(const Program& program);

// How a split batch's parts combine into the whole batch's loss and
// gradients.
enum class LossCombine {
  kAverage,  // a mean over samples (or a constant): the parts' average
  kSum,      // a sum over samples: the parts' total, with no 1/parts
};

// How the program's loss combines over a split batch: averaged for a mean
// over samples (or a constant), added up for a sum over them; else
// InvalidArgument saying the loss's form and the op that made it (samples
// that meet, or a sum plus a constant, which neither combination gives).
absl::StatusOr<LossCombine> LossCombination(const Program& program);

// A split batch reports each fetch (a scalar metric) combined over its
// parts: the program's fetches that are sums over samples, whose parts' values
// add up to the whole batch's (a count of correct predictions), in the
// program's order. Means and constants are averaged.
std::vector<std::string> SummedFetches(const Program& program);

// OK when every fetch is a mean, a sum or a constant, so its parts combine
// into the whole batch's value; else InvalidArgument naming the fetch, its
// form and the op that made it (a batch statistic through a nonlinearity).
absl::Status CheckFetchesCombine(const Program& program);

}  // namespace strata

#endif  // STRATA_ANALYSIS_SAMPLE_FORMS_H_
