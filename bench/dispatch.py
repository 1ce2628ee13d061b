"""bench/dispatch: per-op overhead on a chain of 1000 tiny elementwise ops
(y = x + 0.001 on a [1, 8] float tensor, then a mean), Strata's executor
(Executor::Evaluate, google/benchmark in dispatch_bench) against PyTorch eager
(torch.add in a Python loop under no_grad; the Python loop is part of eager's
cost). ns/op = wall time of one chain / ops in it. Ratio = torch / strata
(> 1: Strata faster). Goal: Strata <= 500 ns/op. Both chains are
single-threaded, so the goal and the ratio use CPU time (the wall time of an
idle machine; Strata: process CPU time, torch: the calling thread's), and
the wall times are printed beside them. Rounds alternate the sides as in
train_step (bench_common.run_round); the figure is the median over rounds.

  bazel run //bench:dispatch -- [--threads N] [--rounds R]

On a GPU (--device gpu, with dispatch_bench_gpu): the same chain on GPU 0
from a feed already there, every op a kernel launch, one synchronisation per
chain on both sides (Strata reads its loss back, torch calls .item()); the
ratio uses wall time there, which is what launch overhead costs. There the
chain also runs as a Strata training step (forward, backward, SGD), eager
and as one CUDA graph replayed (--cuda_graph), per op of the step.

  python3 bench/dispatch.py --device gpu --strata "bash .device/run.sh dispatch_bench_gpu"
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

CHAIN = 1000
BIAS = 0.001


def torch_side(threads, reps, device="cpu"):
    import torch

    torch.set_num_threads(threads)
    x0 = torch.ones(1, 8, device="cuda" if device == "gpu" else "cpu")

    def chain():
        x = x0
        for _ in range(CHAIN):
            x = torch.add(x, BIAS)
        y = x.mean()
        return y.item() if device == "gpu" else y  # on a GPU, the one synchronisation, as Strata's loss read

    with torch.no_grad():
        got = float(chain())  # validate before timing: 1 + 1000 * 0.001
        want = 1 + CHAIN * BIAS
        if abs(got - want) > 1e-4 * want:
            raise SystemExit("torch validation: %g, want %g" % (got, want))
        for _ in range(20):
            chain()
        ns, cpu_ns = [], []
        for _ in range(reps):
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            chain()
            cpu_ns.append((time.thread_time_ns() - c0) / (CHAIN + 1))
            ns.append((time.perf_counter_ns() - t0) / (CHAIN + 1))
    print("RESULT side=torch ops=%d threads=%d ns_per_op=%.1f cpu_ns_per_op=%.1f"
          % (CHAIN + 1, torch.get_num_threads(), bench_common.median(ns), bench_common.median(cpu_ns)))


def strata_side(binary, threads):
    p = subprocess.run(shlex.split(binary) + ["--benchmark_format=json", "--benchmark_repetitions=5",
                        "--benchmark_report_aggregates_only=true"],
                       env=bench_common.child_env(threads), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("bench: dispatch_bench exited with %d" % p.returncode)
    report = json.loads(p.stdout)
    medians = {}
    for b in report["benchmarks"]:
        if b.get("error_occurred"):
            raise SystemExit("dispatch_bench: " + b.get("error_message", "error"))
        if b.get("aggregate_name") == "median":
            assert b["time_unit"] == "us", b["time_unit"]
            medians[b["run_name"]] = {"ns_per_op": b["real_time"] * 1e3 / b["ops"],
                                      "cpu_ns_per_op": b["cpu_time"] * 1e3 / b["ops"], "ops": int(b["ops"])}
    chain = [v for k, v in medians.items() if k.startswith("BM_StrataDispatch/")]
    if not chain:
        raise SystemExit("dispatch_bench: no median in its JSON output")
    result = dict(chain[0])
    # On a GPU: the chain as a training step, eager and as a CUDA graph replayed.
    for k, v in medians.items():
        if k.startswith("BM_StrataTrainStepDispatch/"):
            result["step_graph" if "graph:1" in k else "step_eager"] = v
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", help="path of dispatch_bench (the sh_binary passes it)")
    ap.add_argument("--threads", type=int, default=bench_common.default_threads())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--device", default="cpu", choices=["cpu", "gpu"],
                    help="gpu: --strata runs dispatch_bench_gpu; torch on CUDA; ratios of wall time")
    ap.add_argument("--torch_side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--reps", type=int, default=200, help=argparse.SUPPRESS)
    args = ap.parse_args()
    bench_common.line_buffered()
    if args.torch_side:
        torch_side(args.threads, args.reps, args.device)
        return
    if not args.strata:
        raise SystemExit("--strata PATH is required (run through bazel run //bench:dispatch)")

    print("dispatch: chain of %d ops on a [1, 8] tensor, %s, %d threads, %d rounds, load average %.2f"
          % (CHAIN, args.device, args.threads, args.rounds, bench_common.load_average()))
    # On a GPU the cost is the launches' wall time; on the CPU both chains are single-threaded CPU work.
    key = "ns_per_op" if args.device == "gpu" else "cpu_ns_per_op"
    strata_cpu, strata_wall, torch_cpu, torch_wall = [], [], [], []
    for r in range(args.rounds):
        s, t, config = bench_common.run_round(
            lambda: strata_side(args.strata, args.threads),
            [sys.executable, os.path.abspath(__file__), "--torch_side", "--threads=%d" % args.threads,
             "--device=" + args.device],
            args.threads, key)
        strata_cpu.append(s["cpu_ns_per_op"])
        strata_wall.append(s["ns_per_op"])
        torch_cpu.append(t["cpu_ns_per_op"])
        torch_wall.append(t["ns_per_op"])
        print("  round %d: strata %7.1f ns/op CPU (%7.1f wall, %d ops)  torch eager %7.1f ns/op CPU (%7.1f wall, %s)  "
              "ratio %.2f  load %.1f"
              % (r + 1, s["cpu_ns_per_op"], s["ns_per_op"], s["ops"], t["cpu_ns_per_op"], t["ns_per_op"], config,
                 t[key] / s[key], bench_common.load_average()))
    m = bench_common.median
    if args.device == "gpu":
        sm, tm = m(strata_wall), m(torch_wall)
        print("dispatch (gpu): strata %.1f ns/op wall (%.1f CPU)  torch eager %.1f ns/op wall (%.1f CPU)  "
              "torch/strata %.2f" % (sm, m(strata_cpu), tm, m(torch_cpu), tm / sm))
        print("RESULT bench=dispatch device=gpu strata_ns_per_op=%.1f torch_ns_per_op=%.1f ratio=%.3f" % (sm, tm, tm / sm))
        if "step_graph" in s and "step_eager" in s:
            # The last round's training-step figures (dispatch_bench's own median of 5 repetitions).
            ge, gg = s["step_eager"]["ns_per_op"], s["step_graph"]["ns_per_op"]
            print("train step as %d ops (forward, backward, SGD): strata eager %.1f ns/op wall, CUDA graph %.1f "
                  "ns/op wall (eager/graph %.2f); torch eager forward chain %.1f ns/op (torch/graph %.2f)"
                  % (s["step_graph"]["ops"], ge, gg, ge / gg, tm, tm / gg))
            print("RESULT bench=dispatch_step device=gpu eager_ns_per_op=%.1f graph_ns_per_op=%.1f eager_over_graph=%.3f "
                  "torch_over_graph=%.3f" % (ge, gg, ge / gg, tm / gg))
        return
    sm, tm = m(strata_cpu), m(torch_cpu)
    print("dispatch: strata %.1f ns/op CPU (%.1f wall)  torch eager %.1f ns/op CPU (%.1f wall)  torch/strata %.2f  "
          "(goal strata <= 500 ns/op: %s)"
          % (sm, m(strata_wall), tm, m(torch_wall), tm / sm, "PASS" if sm <= 500 else "MISS"))


if __name__ == "__main__":
    main()
