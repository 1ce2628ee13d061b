"""bench/train_step: one training step (forward, backward, Adam) of the MLP
784-256-128-100-10 at batch 256 and of the convnet at batch 64, Strata against
PyTorch CPU with the same thread count, shapes and optimizer.

Each round alternates the two sides as separate processes (torch once under
each of its usual OpenMP wait policies, Strata as many times; each side keeps
its faster run: bench_common.run_round), so both see the same machine load
and get the same number of draws; the figure per side is the median over
rounds of each round's median step time. Ratio = torch_ms / strata_ms (> 1: Strata faster).

  bazel run //bench:train_step -- [--threads N] [--rounds R] [--steps S] [--models mlp,convnet]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

BATCH = {"mlp": 256, "convnet": 64}


def torch_side(model, batch, warmup, steps, threads):
    import torch

    torch.set_num_threads(threads)
    step = bench_common.torch_train_step(model, batch)
    first, last, ms = bench_common.time_steps(step, warmup, steps)
    print("RESULT side=torch model=%s batch=%d threads=%d median_ms=%.4f min_ms=%.4f loss_first=%.5f loss_last=%.5f"
          % (model, batch, torch.get_num_threads(), bench_common.median(ms), min(ms), first, last))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", help="path of train_step_strata (the sh_binary passes it)")
    ap.add_argument("--threads", type=int, default=bench_common.default_threads())
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=0, help="timed steps per round; 0: 50 for mlp, 20 for convnet")
    ap.add_argument("--models", default="mlp,convnet")
    ap.add_argument("--torch_side", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    bench_common.line_buffered()

    if args.torch_side:
        torch_side(args.torch_side, args.batch, args.warmup, args.steps, args.threads)
        return
    if not args.strata:
        raise SystemExit("--strata PATH is required (run through bazel run //bench:train_step)")

    print("train_step: %d threads (STRATA_NUM_THREADS = OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = torch.set_num_threads), "
          "%d rounds, load average %.2f" % (args.threads, args.rounds, bench_common.load_average()))
    failed = False
    for model in args.models.split(","):
        batch = BATCH[model]
        steps = args.steps or (50 if model == "mlp" else 20)
        common = ["--warmup=%d" % args.warmup, "--steps=%d" % steps]
        strata_ms, torch_ms = [], []
        for r in range(args.rounds):
            s, t, config = bench_common.run_round(
                lambda: bench_common.run_child([args.strata, "--model=" + model, "--batch=%d" % batch] + common,
                                               args.threads),
                [sys.executable, os.path.abspath(__file__), "--torch_side", model, "--batch=%d" % batch,
                 "--threads=%d" % args.threads] + common,
                args.threads, "median_ms")
            strata_ms.append(s["median_ms"])
            torch_ms.append(t["median_ms"])
            print("  %-7s round %d: strata %8.3f ms  torch %8.3f ms (%s)  ratio %.2f  load %.1f"
                  % (model, r + 1, s["median_ms"], t["median_ms"], config, t["median_ms"] / s["median_ms"],
                     bench_common.load_average()))
        sm, tm = bench_common.median(strata_ms), bench_common.median(torch_ms)
        ratio = tm / sm
        ok = ratio >= 1.0
        failed |= not ok
        print("%-7s batch %3d: strata %8.3f ms/step  torch %8.3f ms/step  torch/strata %.2f  (goal >= 1.00: %s)"
              % (model, batch, sm, tm, ratio, "PASS" if ok else "MISS"))
    # A benchmark reports; missing a goal is not an error exit.
    print("train_step goals: %s" % ("all met" if not failed else "MISSED (see MISS lines)"))


if __name__ == "__main__":
    main()
