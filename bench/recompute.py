"""bench/recompute: what recompute saves in activations and costs in time.

Two models, each trained with and without a `recompute { checkpoints }`
strategy (the same program, batch, seed and synthetic data):

- resmlp: `strata gen resmlp --layers 784,256,10 --blocks 16`, batch 256,
  checkpoints every 2 blocks (h2, h4, ..., h16);
- convnet: `strata gen convnet`, batch 64, checkpoints at the two pool
  outputs (conv1.pool, conv2.pool): each conv block's output, the smallest
  var after it.

Activations, measured: the run's measured peak (`strata run --metrics`,
summary.measured_peak_bytes: the allocator's peak, eval included) minus the
parameter and optimizer-state bytes of its plan (`strata compile --out`,
memory.param_bytes + memory.state_bytes); the plan's predicted activation
peak is printed beside it. Cut = 1 - with / without.

Time: the median step (step_ms of the --metrics file, steps after the
warm-up) of each run; rounds alternate which side runs first; the figure per
side is the median over rounds, with the spread (lowest-highest round).
Ratio = with / without (> 1: recompute slower).

Validation before anything is timed: the two runs' losses are finite and
equal step for step (recompute changes memory, never numbers).

Goal (the issue): a cut of 50% or more for at most 40% more time.

  bazel run //bench:recompute -- [--rounds R] [--steps S] [--models resmlp,convnet] [--threads T] [--batch B]
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

MODELS = {
    "resmlp": {
        "gen": ["resmlp", "--layers", "784,256,10", "--blocks", "16"],
        "batch": 256,
        "checkpoints": ["h%d" % k for k in range(2, 17, 2)],
    },
    "convnet": {
        "gen": ["convnet"],
        "batch": 64,
        "checkpoints": ["conv1.pool", "conv2.pool"],
    },
}
GOAL_CUT = 0.50
GOAL_RATIO = 1.40


def mib(b):
    return b / 1048576.0


def run(cmd, threads):
    p = subprocess.run(cmd, env=bench_common.child_env(threads), capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("bench: %s exited with %d" % (" ".join(cmd[:2]), p.returncode))
    return p.stdout


def plan_memory(args, program, strategy, batch, out_dir):
    """memory.param_bytes, state_bytes, activation_peak_bytes, peak_bytes of rank 0's plan."""
    cmd = [args.strata, "compile", program, "--batch_size", str(batch), "--out", out_dir]
    if strategy:
        cmd += ["--strategy", strategy]
    run(cmd, args.threads)
    text = open(os.path.join(out_dir, "rank_0.pbtxt")).read()
    memory = text[text.rindex("\nmemory {"):]
    fields = {}
    for key in ("param_bytes", "state_bytes", "activation_peak_bytes", "peak_bytes"):
        m = re.search(r"\n  %s: (\d+)" % key, memory)
        fields[key] = int(m.group(1)) if m else 0
    return fields


def train(args, program, strategy, batch, tmp):
    """One run: losses, the median step after the warm-up, the measured peak."""
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.strata, "run", program, "--steps", str(args.warmup + args.steps), "--batch_size", str(batch),
           "--data", "synthetic:classes=10", "--seed", "1", "--metrics", metrics, "--quiet"]
    if strategy:
        cmd += ["--strategy", strategy]
    run(cmd, args.threads)
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    steps = [l for l in lines if "step_ms" in l]
    summary = [l["summary"] for l in lines if "summary" in l]
    if len(steps) != args.warmup + args.steps or not summary:
        raise SystemExit("bench: expected %d step lines and a summary in %s" % (args.warmup + args.steps, metrics))
    return {
        "losses": [l["loss"] for l in steps],
        "median_ms": bench_common.median([l["step_ms"] for l in steps[args.warmup:]]),
        "measured_peak": summary[-1]["measured_peak_bytes"],
        "predicted_peak": summary[-1]["predicted_peak_bytes"],
    }


def bench_model(args, name, tmp):
    cfg = MODELS[name]
    program = os.path.join(tmp, name + ".pbtxt")
    with open(program, "w") as f:
        f.write(run([args.strata, "gen"] + cfg["gen"], args.threads))
    strategy = os.path.join(tmp, name + ".recompute.pbtxt")
    with open(strategy, "w") as f:
        f.write("recompute { checkpoints: [%s] }\n" % ", ".join('"%s"' % c for c in cfg["checkpoints"]))
    batch = args.batch or cfg["batch"]
    sides = {"without": None, "with": strategy}
    plans = {s: plan_memory(args, program, path, batch, os.path.join(tmp, name + "." + s)) for s, path in sides.items()}

    # Validation: finite losses, the same step for step with and without.
    # (Whether they fall says nothing here: the convnet barely moves off
    # ln 10 on synthetic data in 35 steps.)
    first = {s: train(args, program, path, batch, tmp) for s, path in sides.items()}
    if first["with"]["losses"] != first["without"]["losses"]:
        raise SystemExit("error: %s: losses differ with recompute: %s vs %s" %
                         (name, first["with"]["losses"][:4], first["without"]["losses"][:4]))
    losses = first["without"]["losses"]
    if not all(v == v and abs(v) < 1e30 for v in losses):
        raise SystemExit("error: %s: a loss is not finite: %s" % (name, losses))

    results = {"without": [], "with": []}
    for r in range(args.rounds):
        order = ["without", "with"] if r % 2 == 0 else ["with", "without"]
        for s in order:
            results[s].append(train(args, program, sides[s], batch, tmp))
        print("  %s round %d/%d: without %.2f ms, with %.2f ms (load %.2f)" %
              (name, r + 1, args.rounds, results["without"][-1]["median_ms"], results["with"][-1]["median_ms"],
               bench_common.load_average()))

    out = {}
    for s in sides:
        plan = plans[s]
        peaks = {x["measured_peak"] for x in results[s]}
        if len(peaks) != 1:
            print("  note: %s %s: measured peaks differ between runs: %s" % (name, s, sorted(peaks)))
        measured = max(peaks)
        ms = [x["median_ms"] for x in results[s]]
        out[s] = {
            "measured_act": measured - plan["param_bytes"] - plan["state_bytes"],
            "predicted_act": plan["activation_peak_bytes"],
            "measured_peak": measured,
            "predicted_peak": plan["peak_bytes"],
            "ms": bench_common.median(ms),
            "ms_lo": min(ms),
            "ms_hi": max(ms),
        }
    cut = 1 - out["with"]["measured_act"] / out["without"]["measured_act"]
    ratio = out["with"]["ms"] / out["without"]["ms"]
    met = cut >= GOAL_CUT and ratio <= GOAL_RATIO
    print("%s (batch %d, checkpoints %s; parameters %.2f MiB, optimizer state %.2f MiB):" %
          (name, batch, ",".join(cfg["checkpoints"]), mib(plans["with"]["param_bytes"]),
           mib(plans["with"]["state_bytes"])))
    for s in ("without", "with"):
        o = out[s]
        print("  %-7s recompute: activations %.2f MiB measured (predicted %.2f), peak %.2f MiB measured "
              "(predicted %.2f), step %.2f ms median (%.2f-%.2f)" %
              (s, mib(o["measured_act"]), mib(o["predicted_act"]), mib(o["measured_peak"]),
               mib(o["predicted_peak"]), o["ms"], o["ms_lo"], o["ms_hi"]))
    print("  cut %.0f%% of the activations for %.2fx the step time: %s (goal: cut >= %.0f%%, time <= %.2fx)" %
          (100 * cut, ratio, "met" if met else "MISS", 100 * GOAL_CUT, GOAL_RATIO))
    print("RESULT model=%s batch=%d act_without_mib=%.3f act_with_mib=%.3f cut_pct=%.1f ms_without=%.3f "
          "ms_with=%.3f ratio=%.3f goal=%s" %
          (name, batch, mib(out["without"]["measured_act"]), mib(out["with"]["measured_act"]), 100 * cut,
           out["without"]["ms"], out["with"]["ms"], ratio, "met" if met else "miss"))


def main():
    bench_common.line_buffered()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", required=True)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--models", default="resmlp,convnet")
    ap.add_argument("--threads", type=int, default=bench_common.default_threads())
    ap.add_argument("--batch", type=int, default=0, help="every model at this batch (0: each its own)")
    args = ap.parse_args()
    print("bench/recompute: %d rounds of %d steps (+%d warm-up), %d threads, load %.2f" %
          (args.rounds, args.steps, args.warmup, args.threads, bench_common.load_average()))
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            if name not in MODELS:
                raise SystemExit("bench: unknown model '%s' (%s)" % (name, ", ".join(MODELS)))
            bench_model(args, name, tmp)


if __name__ == "__main__":
    main()
