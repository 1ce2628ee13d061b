"""bench/allreduce: Gloo allreduce between 2 processes over loopback.

(a) By message size (1 KB to 64 MB, powers of 4): Strata's GlooCommunicator
    (allreduce_strata, two processes meeting through a file:// store, as
    `strata run --nproc 2` does) against torch.distributed.all_reduce on the
    gloo backend (two processes, tcp:// init), in the same run. Each call is
    posted and waited for alone; the figure is the median call.
    busbw = 2 (n-1)/n * bytes / time (n = 2: bytes / time).
(b) The convnet's gradients (the PARAM shapes of `strata gen convnet`) summed
    as one bucket (copied into one flat buffer, one allreduce, copied back
    out, as bucket_allreduce and bucket_wait do) against one allreduce per
    gradient (all posted before the first is waited for). Goal: bucketed at
    least 3x faster. Torch's figures for the same two ways are printed
    beside them.

Rounds alternate the sides (Strata, then torch); each printed figure is the
median over rounds, with the range of the rounds in brackets. One thread per
rank on both sides (STRATA_NUM_THREADS = OPENBLAS_NUM_THREADS =
OMP_NUM_THREADS = torch.set_num_threads = 1); Gloo's own threads come on top.

  bazel run //bench:allreduce -- [--rounds R] [--sizes 1024,4096,...] [--iters N]
"""

import argparse
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common  # noqa: E402

SIZES = [1024 * 4**k for k in range(9)]  # 1 KB .. 64 MB


def calls_for(nbytes):
    """The same count allreduce_strata uses."""
    return max(5, min(1000, (256 << 20) // nbytes))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_rows(text):
    rows = []
    for line in text.splitlines():
        if line.startswith("ROW "):
            row = {}
            for field in line.split()[1:]:
                k, _, v = field.partition("=")
                try:
                    row[k] = float(v)
                except ValueError:
                    row[k] = v
            rows.append(row)
    return rows


def run_pair(argvs):
    """Starts both ranks' argv at once; returns rank 0's ROW lines."""
    env = bench_common.child_env(1)
    procs = [subprocess.Popen(a, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for a in argvs]
    outs = [p.communicate(timeout=900) for p in procs]
    for p, (out, err), a in zip(procs, outs, argvs):
        if p.returncode != 0:
            sys.stderr.write(out + err)
            raise SystemExit("bench: %s exited with %d" % (" ".join(a[:3]), p.returncode))
    return parse_rows(outs[0][0])


def strata_pair(binary, mode, extra):
    store = "file://" + tempfile.mkdtemp(prefix="strata-allreduce-")
    return run_pair([[binary, "--rank=%d" % r, "--world=2", "--store=" + store, "--mode=" + mode] + extra
                     for r in range(2)])


def torch_pair(mode, extra):
    port = free_port()
    return run_pair([[sys.executable, os.path.abspath(__file__), "--torch_side", mode, "--rank=%d" % r,
                      "--port=%d" % port] + extra for r in range(2)])


def torch_side(args):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % args.port, rank=args.rank, world_size=2)
    rank = args.rank
    if args.torch_side == "sizes":
        for nbytes in [int(s) for s in args.sizes.split(",")]:
            t = torch.zeros(nbytes // 4)
            calls = calls_for(nbytes)
            warmup = max(2, calls // 10)
            ms = []
            for i in range(warmup + calls):
                t0 = time.perf_counter()
                dist.all_reduce(t)
                if i >= warmup:
                    ms.append((time.perf_counter() - t0) * 1e3)
            check = torch.ones(1)
            dist.all_reduce(check)
            if check.item() != 2:
                raise SystemExit("torch allreduce check: got %g" % check.item())
            med = bench_common.median(ms)
            if rank == 0:
                print("ROW side=torch case=size bytes=%d calls=%d median_ms=%.5f min_ms=%.5f busbw_gbs=%.4f"
                      % (nbytes, calls, med, min(ms), nbytes / (med * 1e-3) / 1e9), flush=True)
    else:
        shapes = [[int(d) for d in s.split("x")] for s in args.shapes.split(",")]
        grads = [torch.zeros(s) for s in shapes]
        total = sum(g.numel() for g in grads)
        bucket = torch.zeros(total)
        outs = [torch.zeros(s) for s in shapes]
        warmup = max(5, args.iters // 10)
        bucketed, bare, per_grad = [], [], []
        for i in range(warmup + args.iters):
            t0 = time.perf_counter()
            at = 0
            for g in grads:
                bucket[at:at + g.numel()].copy_(g.view(-1))
                at += g.numel()
            dist.all_reduce(bucket)
            at = 0
            for o in outs:
                o.view(-1).copy_(bucket[at:at + o.numel()])
                at += o.numel()
            t1 = time.perf_counter()
            dist.all_reduce(bucket)
            t2 = time.perf_counter()
            works = [dist.all_reduce(g, async_op=True) for g in grads]
            for w in works:
                w.wait()
            t3 = time.perf_counter()
            if i >= warmup:
                bucketed.append((t1 - t0) * 1e3)
                bare.append((t2 - t1) * 1e3)
                per_grad.append((t3 - t2) * 1e3)
        if rank == 0:
            print("ROW side=torch case=grads gradients=%d bytes=%d iters=%d bucketed_ms=%.5f bucket_only_ms=%.5f "
                  "per_grad_ms=%.5f" % (len(grads), total * 4, args.iters, bench_common.median(bucketed),
                                        bench_common.median(bare), bench_common.median(per_grad)), flush=True)
    # torch 1.13's ProcessGroupGloo destructor can deadlock at exit (seen:
    # rank 1 stuck in ~ProcessGroupGloo under ~Reducer), so the ranks meet at
    # a barrier and leave without tearing the group down.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


def convnet_shapes(strata):
    """The PARAM shapes of `strata gen convnet`, as 32x1x3x3,32x1x1,..."""
    text = subprocess.run([strata, "gen", "convnet"], capture_output=True, text=True, check=True).stdout
    shapes = re.findall(r'var \{ name: "[^"]+" dtype: F32 shape: \[([0-9, ]+)\] kind: PARAM', text)
    if not shapes:
        raise SystemExit("error: no PARAM vars in `strata gen convnet`")
    return ",".join("x".join(d.strip() for d in s.split(",")) for s in shapes)


def spread(values, fmt):
    return "[" + fmt % min(values) + "-" + fmt % max(values) + "]"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata_bin", help="path of allreduce_strata (the sh_binary passes it)")
    ap.add_argument("--strata", help="path of the strata tool (for `strata gen convnet`)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sizes", default=",".join(str(s) for s in SIZES))
    ap.add_argument("--iters", type=int, default=200, help="timed iterations of (b)")
    ap.add_argument("--torch_side", choices=["sizes", "grads"], help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.torch_side:
        torch_side(args)
        return
    bench_common.line_buffered()
    if not args.strata_bin or not args.strata:
        raise SystemExit("--strata_bin and --strata are required (run through bazel run //bench:allreduce)")
    shapes = convnet_shapes(args.strata)
    print("allreduce: 2 processes over loopback, Gloo, F32 sum, 1 thread per rank, %d rounds, %d cores, "
          "load average %.2f" % (args.rounds, os.cpu_count(), bench_common.load_average()))

    sizes = [int(s) for s in args.sizes.split(",")]
    by_size = {(side, s): [] for side in ("strata", "torch") for s in sizes}
    grads = {"strata": [], "torch": []}
    for r in range(args.rounds):
        for row in strata_pair(args.strata_bin, "sizes", ["--sizes=" + args.sizes]):
            by_size[("strata", int(row["bytes"]))].append(row["median_ms"])
        for row in torch_pair("sizes", ["--sizes=" + args.sizes]):
            by_size[("torch", int(row["bytes"]))].append(row["median_ms"])
        grads["strata"] += strata_pair(args.strata_bin, "grads", ["--shapes=" + shapes, "--iters=%d" % args.iters])
        grads["torch"] += torch_pair("grads", ["--shapes=" + shapes, "--iters=%d" % args.iters])
        print("  round %d done, load %.1f" % (r + 1, bench_common.load_average()))

    print("\n(a) allreduce by message size: median call (median over rounds, [range of rounds])")
    print("%10s %24s %24s %18s %18s %16s" % ("bytes", "strata ms", "torch ms", "strata busbw GB/s", "torch busbw GB/s",
                                             "torch/strata ms"))
    for s in sizes:
        st, tt = by_size[("strata", s)], by_size[("torch", s)]
        sm, tm = bench_common.median(st), bench_common.median(tt)
        print("%10d %10.4f %13s %10.4f %13s %18.3f %18.3f %16.2f" % (
            s, sm, spread(st, "%.3f"), tm, spread(tt, "%.3f"), s / sm / 1e6, s / tm / 1e6, tm / sm))

    print("\n(b) the convnet's %d gradients (%s), %d bytes in all, %d iterations a round"
          % (len(shapes.split(",")), shapes, int(grads["strata"][0]["bytes"]), args.iters))
    results = {}
    for side in ("strata", "torch"):
        rows = grads[side]
        b = [r["bucketed_ms"] for r in rows]
        o = [r["bucket_only_ms"] for r in rows]
        p = [r["per_grad_ms"] for r in rows]
        ratios = [r["per_grad_ms"] / r["bucketed_ms"] for r in rows]
        results[side] = (bench_common.median(b), bench_common.median(o), bench_common.median(p),
                         bench_common.median(ratios), ratios)
        print("  %-6s one bucket with copies %8.3f ms %s, the allreduce alone %8.3f ms %s, one allreduce per "
              "gradient %8.3f ms %s; per-gradient / bucketed %.2f %s"
              % (side, results[side][0], spread(b, "%.3f"), results[side][1], spread(o, "%.3f"), results[side][2],
                 spread(p, "%.3f"), results[side][3], spread(ratios, "%.2f")))
    ratio = results["strata"][3]
    ok = ratio >= 3.0
    print("strata bucketed against per-gradient: %.2fx faster (goal >= 3.00: %s)" % (ratio, "PASS" if ok else "MISS"))
    small = [s for s in sizes if s <= 65536]
    if small:
        print("strata/torch call time, messages <= 64 KB (median over sizes): %.2f"
              % bench_common.median([bench_common.median(by_size[("strata", s)]) /
                                     bench_common.median(by_size[("torch", s)]) for s in small]))
    print("RESULT bucket_ratio=%.3f goal=%s" % (ratio, "PASS" if ok else "MISS"))


if __name__ == "__main__":
    main()
