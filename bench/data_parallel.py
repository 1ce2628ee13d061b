"""bench/data_parallel: one data-parallel training step at degree 2.

The MLP 784-256-128-100-10 at global batch 256 and `strata gen convnet` at
global batch 64, each split over 2 worker processes:

- Strata: `strata run PROG --strategy dp2 --nproc 2` with
  `data_parallel { degree: 2 bucket_mb: 25 }`, synthetic data, the step times
  from its `--metrics` file (step_ms of every step after the warm-up);
- PyTorch: DistributedDataParallel over its gloo backend, 2 processes, the
  same model, Adam (the generated programs' optimizer, lr 1e-3) with a cosine
  schedule stepped every step, bucket_cap_mb = 25, each rank on its half of a
  fixed synthetic batch prepared before timing; each step ends with the
  group's mean loss and accuracy on the host (one small all_reduce, as
  Strata's trainer does to report them).

One thread per rank on both sides (STRATA_NUM_THREADS = OPENBLAS_NUM_THREADS
= OMP_NUM_THREADS = torch.set_num_threads = 1). With --bind (the default)
Strata runs with --bind_cores and each torch rank pins itself to the same
core (rank r on the r-th allowed core). Rounds alternate the sides as
train_step does (bench_common.run_round: torch under both OpenMP wait
policies, Strata as many times, each keeping its faster run); the figure per
side is the median over rounds of each run's median steady-state step.
Ratio = torch ms / Strata ms (> 1: Strata faster).

Also, from Strata's own output: the bytes it allreduces per step (the
@dp_bucket.* vars of the compiled plan, `strata compile --out`) against the
parameter bytes `strata check` prints (goal: equal), and from a traced run
the median time per step in bucket_allreduce (copying the gradients into the
bucket and posting its sum) and bucket_wait (waiting for the sum and copying
the gradients out).

  bazel run //bench:data_parallel -- [--rounds R] [--models mlp,convnet] [--steps S] [--no_bind]
"""

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

BATCH = {"mlp": 256, "convnet": 64}
DEGREE = 2
BUCKET_MB = 25
DTYPE_BYTES = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I64": 8, "I32": 4}


def strata_once(args, program, strategy, batch, steps, tmp, trace=None):
    metrics = os.path.join(tmp, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [args.strata, "run", program, "--strategy", strategy, "--nproc", str(DEGREE), "--steps",
           str(args.warmup + steps), "--batch_size", str(batch), "--data", "synthetic:classes=10",
           "--metrics", metrics, "--quiet"] + (["--bind_cores"] if args.bind else [])
    if trace:
        cmd += ["--trace", trace]
    p = subprocess.run(cmd, env=bench_common.child_env(1), capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit("bench: strata run exited with %d" % p.returncode)
    lines = [json.loads(l) for l in open(metrics) if l.strip()]
    steps_lines = [l for l in lines if "step_ms" in l]
    if len(steps_lines) != args.warmup + steps:
        raise SystemExit("bench: expected %d metric lines, got %d" % (args.warmup + steps, len(steps_lines)))
    losses = [l["loss"] for l in steps_lines]
    if not all(map(lambda v: v == v and abs(v) < 1e30, losses)) or not losses[-1] < losses[0]:
        raise SystemExit("error: strata validation: loss did not fall (%g -> %g)" % (losses[0], losses[-1]))
    ms = [l["step_ms"] for l in steps_lines[args.warmup:]]
    return {"median_ms": bench_common.median(ms), "min_ms": min(ms), "loss_first": losses[0], "loss_last": losses[-1]}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torch_pair(args, model, batch, steps, extra_env):
    port = free_port()
    env = bench_common.child_env(1, extra_env)
    argv = [sys.executable, os.path.abspath(__file__), "--torch_side", model, "--batch=%d" % batch,
            "--warmup=%d" % args.warmup, "--steps=%d" % steps, "--port=%d" % port] + ([] if args.bind else ["--no_bind"])
    procs = [subprocess.Popen(argv + ["--rank=%d" % r], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(DEGREE)]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, outs):
        if p.returncode != 0:
            sys.stderr.write(out + err)
            raise SystemExit("bench: torch rank exited with %d" % p.returncode)
    return bench_common.parse_result(outs[0][0])


def torch_side(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = args.rank
    if args.bind:
        cores = sorted(os.sched_getaffinity(0))
        share = max(1, len(cores) // DEGREE)
        os.sched_setaffinity(0, cores[rank * share:(rank + 1) * share] or cores)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=rank, world_size=DEGREE)
    local = args.batch // DEGREE
    torch.manual_seed(0)  # the same initial weights on both ranks (DDP broadcasts rank 0's anyway)
    if args.torch_side == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 128),
                                  torch.nn.ReLU(), torch.nn.Linear(128, 100), torch.nn.ReLU(),
                                  torch.nn.Linear(100, 10))
        shape = (local, 784)
    else:
        net = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                  torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                                  torch.nn.Flatten(), torch.nn.Linear(64 * 7 * 7, 128), torch.nn.ReLU(),
                                  torch.nn.Linear(128, 10))
        shape = (local, 1, 28, 28)
    gen = torch.Generator().manual_seed(1 + rank)  # each rank its own half of the global batch
    x = torch.rand(shape, generator=gen)
    y = torch.randint(0, 10, (local,), generator=gen)
    ddp = DDP(net, bucket_cap_mb=BUCKET_MB)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=1_000_000)

    def step():
        opt.zero_grad(set_to_none=True)
        logits = ddp(x)
        loss = F.cross_entropy(logits, y)
        acc = (logits.argmax(1) == y).float().mean()
        loss.backward()
        opt.step()
        sched.step()
        report = torch.stack([loss.detach(), acc])
        dist.all_reduce(report)
        report /= DEGREE
        return report[0].item(), report[1].item()

    first, last, ms = bench_common.time_steps(step, args.warmup, args.steps)
    buckets = ""
    try:
        data = ddp._get_ddp_logging_data()
        buckets = " ddp_bucket_sizes=%s" % str(data.get("rebuilt_bucket_sizes", data.get("bucket_sizes", "?"))
                                                ).replace(" ", "")
    except Exception:  # a private API: print nothing if it is not there
        pass
    if rank == 0:
        print("RESULT side=torch model=%s batch=%d threads=%d median_ms=%.4f min_ms=%.4f loss_first=%.5f "
              "loss_last=%.5f%s" % (args.torch_side, args.batch, torch.get_num_threads(), bench_common.median(ms),
                                    min(ms), first, last, buckets), flush=True)
    # torch 1.13's ProcessGroupGloo destructor can deadlock at exit (seen:
    # rank 1 stuck in ~ProcessGroupGloo under ~Reducer), so the ranks meet at
    # a barrier and leave without tearing the group down.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def parameter_bytes(args, program, strategy, batch):
    out = subprocess.run([args.strata, "check", program, "--strategy", strategy, "--batch_size", str(batch)],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"parameters: (\d+) \(", out)
    if not m:
        raise SystemExit("bench: no 'parameters:' line in strata check:\n" + out)
    return int(m.group(1)) * 4  # every parameter of these programs is F32 (the bucket check below reads dtypes)


def bucket_bytes(args, program, strategy, tmp):
    """Per rank: the bytes of the @dp_bucket.* vars of its compiled plan, and
    the number of bucket_allreduce ops."""
    out = os.path.join(tmp, "plans")
    subprocess.run([args.strata, "compile", program, "--strategy", strategy, "--out", out], capture_output=True,
                   text=True, check=True)
    result = {}
    for name in sorted(os.listdir(out)):
        if not name.startswith("rank_"):
            continue
        text = open(os.path.join(out, name)).read()
        total = 0
        for dtype, dims in re.findall(r'name: "@dp_bucket\.[0-9]+"\s+dtype: (\w+)\s+shape: \[([0-9, ]+)\]', text):
            n = 1
            for d in dims.split(","):
                n *= int(d)
            total += n * DTYPE_BYTES[dtype]
        result[name] = (total, text.count('type: "bucket_allreduce"'))
    return result


def traced_costs(args, program, strategy, batch, steps, tmp):
    """From one traced run: per step (rank 0, after the warm-up), the median
    ms in bucket_allreduce, in bucket_wait and in the whole step (between
    consecutive OPT actions' ends)."""
    trace = os.path.join(tmp, "trace.json")
    strata_once(args, program, strategy, batch, steps, tmp, trace)
    events = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X" and e["tid"] == 0]
    events.sort(key=lambda e: e["ts"])
    per_step, cur = [], {"bucket_allreduce": 0, "bucket_wait": 0, "start": None}
    for e in events:
        if cur["start"] is None:
            cur["start"] = e["ts"]
        if e["name"] in ("bucket_allreduce", "bucket_wait"):
            cur[e["name"]] += e["dur"]
        if e["cat"] == "action" and e["name"] == "OPT":
            cur["step"] = e["ts"] + e["dur"] - cur["start"]
            per_step.append(cur)
            cur = {"bucket_allreduce": 0, "bucket_wait": 0, "start": e["ts"] + e["dur"]}
    per_step = per_step[args.warmup:]
    return {k: statistics.median(s[k] for s in per_step) / 1e3 for k in ("bucket_allreduce", "bucket_wait", "step")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", help="path of the strata tool (the sh_binary passes it)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=0, help="timed steps per run; 0: 50 for mlp, 20 for convnet")
    ap.add_argument("--models", default="mlp,convnet")
    ap.add_argument("--no_bind", dest="bind", action="store_false", help="leave both sides' ranks unpinned")
    ap.add_argument("--torch_side", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_side:
        torch_side(args)
        return
    bench_common.line_buffered()
    if not args.strata:
        raise SystemExit("--strata PATH is required (run through bazel run //bench:data_parallel)")
    tmp = tempfile.mkdtemp(prefix="strata-dp-")
    strategy = os.path.join(tmp, "dp2.pbtxt")
    open(strategy, "w").write("data_parallel { degree: %d bucket_mb: %d }\n" % (DEGREE, BUCKET_MB))
    print("data_parallel: degree %d, bucket %d MB, 1 thread per rank, %s, %d rounds, %d cores, load average %.2f"
          % (DEGREE, BUCKET_MB, "ranks pinned (--bind_cores / sched_setaffinity)" if args.bind else "unpinned",
             args.rounds, os.cpu_count(), bench_common.load_average()))
    failed = False
    for model in args.models.split(","):
        batch = BATCH[model]
        steps = args.steps or (50 if model == "mlp" else 20)
        program = os.path.join(tmp, model + ".pbtxt")
        open(program, "w").write(subprocess.run([args.strata, "gen", model], capture_output=True, text=True,
                                                check=True).stdout)
        strata_ms, torch_ms = [], []
        ddp_buckets = ""
        for r in range(args.rounds):
            strata, torch = [], []
            for name, extra in bench_common.TORCH_CONFIGS:
                strata.append(strata_once(args, program, strategy, batch, steps, tmp))
                torch.append((torch_pair(args, model, batch, steps, extra), name))
            s = min(strata, key=lambda v: v["median_ms"])
            t, config = min(torch, key=lambda v: v[0]["median_ms"])
            ddp_buckets = t.get("ddp_bucket_sizes", ddp_buckets)
            strata_ms.append(s["median_ms"])
            torch_ms.append(t["median_ms"])
            print("  %-7s round %d: strata %8.3f ms  torch DDP %8.3f ms (%s)  ratio %.2f  load %.1f"
                  % (model, r + 1, s["median_ms"], t["median_ms"], config, t["median_ms"] / s["median_ms"],
                     bench_common.load_average()))
        sm, tm = bench_common.median(strata_ms), bench_common.median(torch_ms)
        ratios = [t / s for s, t in zip(strata_ms, torch_ms)]
        ratio = tm / sm
        ok = ratio >= 1.0
        failed |= not ok
        print("%-7s global batch %3d, dp2: strata %8.3f ms/step [%.3f-%.3f]  torch DDP %8.3f ms/step [%.3f-%.3f]  "
              "torch/strata %.2f [%.2f-%.2f]  (goal >= 1.00: %s)"
              % (model, batch, sm, min(strata_ms), max(strata_ms), tm, min(torch_ms), max(torch_ms), ratio,
                 min(ratios), max(ratios), "PASS" if ok else "MISS"))
        if ddp_buckets:
            print("        torch DDP buckets (bytes, after its rebuild): %s" % ddp_buckets)

        params = parameter_bytes(args, program, strategy, batch)
        buckets = bucket_bytes(args, program, strategy, tmp)
        for rank, (nbytes, ops) in buckets.items():
            equal = nbytes == params
            failed |= not equal
            print("        %s: allreduced %d bytes per step in %d bucket(s) against %d parameter bytes: %s"
                  % (rank.replace(".pbtxt", ""), nbytes, ops, params,
                     "equal (PASS)" if equal else "%+d bytes (MISS)" % (nbytes - params)))
        costs = traced_costs(args, program, strategy, batch, steps, tmp)
        print("        traced run, rank 0, median per step: bucket_allreduce (copy in + post) %.3f ms, bucket_wait "
              "(wait + copy out) %.3f ms, of a %.3f ms step"
              % (costs["bucket_allreduce"], costs["bucket_wait"], costs["step"]))
    print("data_parallel goals: %s" % ("all met" if not failed else "MISSED (see MISS lines)"))


if __name__ == "__main__":
    main()
