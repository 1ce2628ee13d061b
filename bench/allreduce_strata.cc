// Strata's side of bench/allreduce: one rank of a 2-process job that meets
// its peer through a file:// store (Rendezvous, as `strata run --nproc` does)
// and times GlooCommunicator::AllReduce (sum, F32, in place). The driver
// (allreduce.py) starts both ranks; rank 0 prints one "ROW key=value ..."
// line per case.
//
//   allreduce_strata --rank=R --world=2 --store=file:///DIR --mode=sizes --sizes=1024,4096,...
//   allreduce_strata --rank=R --world=2 --store=file:///DIR --mode=grads --shapes=32x1x3x3,32x1x1,...
//
// sizes: for each message size (bytes), warm-up calls, then each timed call
// is posted and waited for alone; the median call gives the time.
// grads: the gradients of `--shapes` summed two ways, per iteration:
//   bucketed:     copy every gradient into one flat bucket, one allreduce,
//                 copy every gradient back out (what bucket_allreduce and
//                 bucket_wait do); also the allreduce alone, without copies;
//   per-gradient: one allreduce per gradient, all posted before the first is
//                 waited for (the best case for many small collectives).

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "bench/bench_util.h"
#include "runtime/comm/communicator.h"
#include "runtime/comm/rendezvous.h"
#include "runtime/tensor.h"

namespace strata {
namespace bench {
namespace {

constexpr absl::Duration kWait = absl::Seconds(120);

absl::Status Check(std::unique_ptr<Work> work, const std::string& what) {
  absl::Status s = work->Wait(kWait);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
  return absl::OkStatus();
}

// Calls per size: enough that small messages run about 1000 times and the
// 64 MB ones a few; both ranks derive the same count.
int64_t CallsFor(int64_t bytes) { return std::clamp<int64_t>((int64_t{256} << 20) / bytes, 5, 1000); }

absl::Status Sizes(Communicator& comm, const std::vector<int64_t>& sizes) {
  for (int64_t bytes : sizes) {
    Tensor t = Tensor::Zeros(F32, {bytes / 4});
    if (!t.defined()) return absl::ResourceExhaustedError(absl::StrCat("out of memory for ", bytes, " bytes"));
    const int64_t calls = CallsFor(bytes);
    const int64_t warmup = std::max<int64_t>(2, calls / 10);
    std::vector<double> ms;
    for (int64_t i = 0; i < warmup + calls; ++i) {
      const Clock::time_point t0 = Clock::now();
      if (auto s = Check(comm.AllReduce(&t, ReduceOp::kSum), "allreduce"); !s.ok()) return s;
      if (i >= warmup) ms.push_back(SecondsSince(t0) * 1e3);
    }
    // The timed tensor holds zeros (repeated sums stay finite); a one-element
    // sum checks that the ranks really reduce.
    Tensor check = Tensor::Zeros(F32, {1});
    check.data<float>()[0] = 1.0f;
    if (auto s = Check(comm.AllReduce(&check, ReduceOp::kSum), "check"); !s.ok()) return s;
    if (check.data<float>()[0] != static_cast<float>(comm.size())) {
      return absl::InternalError(absl::StrCat("allreduce check: got ", check.data<float>()[0]));
    }
    const double median = Median(ms);
    const double busbw = 2.0 * (comm.size() - 1) / comm.size() * bytes / (median * 1e-3) / 1e9;
    if (comm.rank() == 0) {
      std::printf("ROW side=strata case=size bytes=%lld calls=%lld median_ms=%.5f min_ms=%.5f busbw_gbs=%.4f\n",
                  static_cast<long long>(bytes), static_cast<long long>(calls), median,
                  *std::min_element(ms.begin(), ms.end()), busbw);
      std::fflush(stdout);
    }
  }
  return absl::OkStatus();
}

absl::Status Grads(Communicator& comm, const std::vector<Shape>& shapes, int64_t iters) {
  std::vector<Tensor> grads;
  int64_t total = 0;
  for (const Shape& shape : shapes) {
    grads.push_back(Tensor::Zeros(F32, shape));
    total += grads.back().num_elements();
  }
  Tensor bucket = Tensor::Zeros(F32, {total});
  std::vector<Tensor> outs;
  for (const Shape& shape : shapes) outs.push_back(Tensor::Zeros(F32, shape));
  const int64_t warmup = std::max<int64_t>(5, iters / 10);
  // The three ways interleave within each iteration, so all see the same load.
  std::vector<double> bucketed, bare, per_grad;
  for (int64_t i = 0; i < warmup + iters; ++i) {
    Clock::time_point t0 = Clock::now();
    char* at = static_cast<char*>(bucket.raw_data());
    for (const Tensor& g : grads) {
      std::memcpy(at, g.raw_data(), g.bytes());
      at += g.bytes();
    }
    if (auto s = Check(comm.AllReduce(&bucket, ReduceOp::kSum), "bucket"); !s.ok()) return s;
    const char* from = static_cast<const char*>(bucket.raw_data());
    for (Tensor& o : outs) {
      std::memcpy(o.raw_data(), from, o.bytes());
      from += o.bytes();
    }
    const double t_bucketed = SecondsSince(t0) * 1e3;

    t0 = Clock::now();
    if (auto s = Check(comm.AllReduce(&bucket, ReduceOp::kSum), "bucket"); !s.ok()) return s;
    const double t_bare = SecondsSince(t0) * 1e3;

    t0 = Clock::now();
    std::vector<std::unique_ptr<Work>> works;
    for (Tensor& g : grads) works.push_back(comm.AllReduce(&g, ReduceOp::kSum));
    for (auto& w : works) {
      if (auto s = Check(std::move(w), "gradient"); !s.ok()) return s;
    }
    const double t_per_grad = SecondsSince(t0) * 1e3;
    if (i >= warmup) {
      bucketed.push_back(t_bucketed);
      bare.push_back(t_bare);
      per_grad.push_back(t_per_grad);
    }
  }
  if (comm.rank() == 0) {
    std::printf("ROW side=strata case=grads gradients=%zu bytes=%lld iters=%lld bucketed_ms=%.5f bucket_only_ms=%.5f "
                "per_grad_ms=%.5f\n",
                shapes.size(), static_cast<long long>(total * 4), static_cast<long long>(iters), Median(bucketed),
                Median(bare), Median(per_grad));
    std::fflush(stdout);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& text, char sep) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, sep, absl::SkipEmpty())) {
    int64_t v;
    if (!absl::SimpleAtoi(part, &v) || v < 1) return absl::InvalidArgumentError(absl::StrCat("bad number '", part, "'"));
    out.push_back(v);
  }
  return out;
}

absl::Status Run(int argc, char** argv) {
  RendezvousOptions options;
  options.rank = static_cast<int>(IntFlag(argc, argv, "rank", 0));
  options.world_size = static_cast<int>(IntFlag(argc, argv, "world", 2));
  options.store_spec = FlagValue(argc, argv, "store", "");
  options.fingerprint = "bench-allreduce";
  options.timeout = absl::Seconds(60);
  options.op_timeout = kWait;
  if (options.store_spec.empty()) return absl::InvalidArgumentError("--store=file:///DIR is required");
  auto comm = Rendezvous(options);
  if (!comm.ok()) return comm.status();
  const std::string mode = FlagValue(argc, argv, "mode", "sizes");
  if (mode == "sizes") {
    auto sizes = ParseList(FlagValue(argc, argv, "sizes", "1024"), ',');
    if (!sizes.ok()) return sizes.status();
    for (int64_t b : *sizes) {
      if (b % 4 != 0) return absl::InvalidArgumentError(absl::StrCat("size ", b, " is not a whole number of floats"));
    }
    return Sizes(**comm, *sizes);
  }
  if (mode == "grads") {
    std::vector<Shape> shapes;
    for (absl::string_view s : absl::StrSplit(FlagValue(argc, argv, "shapes", ""), ',', absl::SkipEmpty())) {
      auto dims = ParseList(std::string(s), 'x');
      if (!dims.ok()) return dims.status();
      shapes.push_back(Shape(dims->begin(), dims->end()));
    }
    if (shapes.empty()) return absl::InvalidArgumentError("--shapes is empty");
    return Grads(**comm, shapes, IntFlag(argc, argv, "iters", 200));
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown --mode ", mode));
}

}  // namespace
}  // namespace bench
}  // namespace strata

int main(int argc, char** argv) {
  absl::Status s = strata::bench::Run(argc, argv);
  if (!s.ok()) {
    std::fprintf(stderr, "allreduce_strata: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
