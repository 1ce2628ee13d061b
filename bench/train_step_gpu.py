"""bench/train_step_gpu: one training step (forward, backward, Adam, the loss
and accuracy read back to the host) of the MLP 784-256-128-100-10 on one
GPU, Strata (train_step_gpu, float32 throughout) against PyTorch eager on the
same GPU with the same shapes, optimizer and per-step host reads, TF32 off,
three ways: eager with Adam's default step, eager with Adam(fused=True), and
torch.compile of the model with the fused Adam.

Each round runs the Strata binary (a separate process) and then the torch
side in this process; the figure per side is the median over rounds of each
round's median step time. Ratio = torch_ms / strata_ms (> 1: Strata faster).
torch.compile's compilation happens in the warm-up steps, outside the timing.

On the GPU machine, from the repository root:
  python3 bench/train_step_gpu.py --strata "bash .device/run.sh train_step_gpu"
"""

import argparse
import datetime
import os
import shlex
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402


VARIANTS = {
    "eager": "torch eager, Adam's default (foreach) step",
    "fused": "torch eager, Adam(fused=True)",
    "compile": "torch.compile(model), Adam(fused=True)",
}


def torch_side(batch, warmup, steps, variant):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    step = bench_common.torch_train_step("mlp", batch, device="cuda", fused_adam=variant != "eager",
                                         compile_model=variant == "compile")
    _, _, ms = bench_common.time_steps(step, warmup, steps)
    return statistics.median(ms), min(ms)


def strata_side(command, batch, warmup, steps):
    argv = shlex.split(command) + ["--model=mlp", "--batch=%d" % batch, "--warmup=%d" % warmup, "--steps=%d" % steps]
    out = subprocess.run(argv, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("error: %s failed (%d): %s" % (command, out.returncode, out.stderr.strip()))
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            fields = dict(kv.split("=", 1) for kv in line.split()[1:])
            return float(fields["median_ms"]), float(fields["min_ms"]), fields
    raise SystemExit("error: no RESULT line from %s" % command)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True, help="command that runs train_step_gpu")
    ap.add_argument("--batches", default="256,4096")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--variants", default="eager,fused,compile")
    args = ap.parse_args()
    import torch
    print("train_step_gpu: %s, torch %s, %s UTC; %d rounds of %d steps; float32, TF32 off" % (
        torch.cuda.get_device_name(0), torch.__version__,
        datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"), args.rounds, args.steps))
    variants = args.variants.split(",")
    for v in variants:
        if v not in VARIANTS:
            raise SystemExit("error: --variants: unknown '%s' (expected %s)" % (v, ",".join(VARIANTS)))
        print("  %-8s %s" % (v, VARIANTS[v]))
    print("%-6s %6s %-8s | %10s %10s | %8s %11s | %s" % (
        "model", "batch", "torch", "strata ms", "torch ms", "ratio", "spread", "strata"))
    for batch in [int(b) for b in args.batches.split(",")]:
        s_ms, t_ms = [], {v: [] for v in variants}
        fields = {}
        for _ in range(args.rounds):
            s, _, fields = strata_side(args.strata, batch, args.warmup, args.steps)
            s_ms.append(s)
            for v in variants:
                t_ms[v].append(torch_side(batch, args.warmup, args.steps, v)[0])
        s = statistics.median(s_ms)
        for v in variants:
            t = statistics.median(t_ms[v])
            ratios = [tv / sv for tv, sv in zip(t_ms[v], s_ms)]
            print("%-6s %6d %-8s | %10.4f %10.4f | %7.2fx %5.2f-%5.2f | ops=%s segments=%s" % (
                "mlp", batch, v, s, t, t / s, min(ratios), max(ratios), fields.get("ops"), fields.get("segments")))
            print("RESULT model=mlp batch=%d torch=%s strata_ms=%.4f torch_ms=%.4f ratio=%.3f ratio_min=%.3f "
                  "ratio_max=%.3f" % (batch, v, s, t, t / s, min(ratios), max(ratios)))
            sys.stdout.flush()

if __name__ == "__main__":
    main()
