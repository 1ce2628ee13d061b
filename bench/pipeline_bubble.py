"""Pipeline bubble: measured against the formula (K-1)/(M+K-1).

Four stages of equal cost (a residual MLP with the same blocks on every
stage), micro-batch counts 4, 8 and 16, both schedules, a table for each
micro-batch size. Each run writes a Chrome trace; from it, per rank and per
step, busy = the time inside forward and backward actions minus the time
their receives waited, and the bubble is 1 - busy / (the step's makespan over
all ranks). The median over steps after the first (warm-up) is compared with
the formula.

"wall-clock" is what this machine gave; with fewer cores than stages the ranks
share cores and it overstates the bubble. "replayed" re-times each action's own
CPU time (from the trace) through the schedule's dependencies, as if every
rank had a core: the bubble the schedule itself costs on these op times.

The formula assumes stages of equal cost, so each table also prints how far
the measured stages were from that. With four ranks on two cores, an action
that waited for a receive resumes after another rank ran on its core, with
that rank's data in the caches; at small micro-batches this costs a forward
10% more on the stages that receive than on the first stage, which breaks the
assumption. Larger micro-batches (128 samples: actions of 1 to 2 ms) make
that a fixed cost of a few percent.

Also the cost of pipeline communication per step: bytes sent over loopback,
and the CPU that sends (writing to the socket) and receives (waiting and
waking) took, against the CPU of all forward and backward actions.

Run: bazel run //bench:pipeline_bubble -- [--steps N] [--width W] [--micro_batch 128 32] [--repeats 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

STAGES = 4  # --stages
BLOCKS = 8


def run(strata, program, strategy, steps, trace, threads, bind):
    env = dict(os.environ, STRATA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    cmd = [strata, "run", program, "--strategy", strategy, "--nproc", str(STAGES), "--steps", str(steps),
           "--data", "synthetic:classes=10,size=8192", "--quiet", "--trace", trace] + (["--bind_cores"] if bind else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"strata failed: {out.stderr}")


def steps_of(path):
    """Per step (split at each rank's OPT action): rank -> (actions, transfers)."""
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    per_rank = {}
    for e in events:
        per_rank.setdefault(e["tid"], []).append(e)
    steps = {}
    for rank, evs in per_rank.items():
        evs.sort(key=lambda e: e["ts"])
        step, actions, comm = 0, [], []
        for e in evs:
            if e["cat"] == "action":
                if e["name"] == "OPT":
                    steps.setdefault(step, {})[rank] = (actions, comm)
                    step, actions, comm = step + 1, [], []
                else:
                    actions.append(e)
            elif e["cat"] == "comm":
                comm.append(e)
    # Step 0 warms up (first touch of every buffer); incomplete steps are dropped.
    return [ranks for step, ranks in sorted(steps.items()) if step > 0 and len(ranks) == STAGES]


def action_cost(action, recvs):
    """An action's own CPU time when traced (neither waiting nor sharing a
    core counts), else its duration minus the receives it waited on."""
    cpu = action.get("args", {}).get("cpu_us")
    if cpu is not None:
        return cpu
    waited = sum(r["dur"] for r in recvs
                 if r["name"].startswith("recv") and action["ts"] <= r["ts"] <= action["ts"] + action["dur"])
    return max(action["dur"] - waited, 0)


def predicted_bubble(strata, program, strategy):
    """The compiler's own prediction (its cost model's timeline): the mean of
    the per-rank bubbles `strata check` prints."""
    out = subprocess.run([strata, "check", program, "--strategy", strategy], capture_output=True, text=True,
                         check=True).stdout
    values = [float(line.rsplit("bubble ", 1)[1].rstrip("%")) / 100 for line in out.splitlines()
              if line.strip().startswith("rank ") and "bubble " in line]
    return statistics.mean(values)


def bubble_from_trace(path):
    """Returns (wall-clock bubble, replayed bubble per step, replayed bubble of
    the median step, communication per step, per-rank medians)."""
    steps = steps_of(path)
    wall, per_step = [], []
    comm = {"send_us": [], "recv_us": [], "compute_us": [], "bytes": []}  # per step, all ranks
    samples = {}  # (rank, action name) -> its cost in every step
    for ranks in steps:
        costs = {}
        for rank, (acts, transfers) in ranks.items():
            for a in acts:
                costs[(rank, a["name"])] = action_cost(a, transfers)
                samples.setdefault((rank, a["name"]), []).append(costs[(rank, a["name"])])
        order = {rank: [a["name"] for a in acts] for rank, (acts, _) in ranks.items()}
        per_step.append(replay(order, costs))
        start = min(a["ts"] for acts, _ in ranks.values() for a in acts)
        end = max(a["ts"] + a["dur"] for acts, _ in ranks.values() for a in acts)
        for rank, (acts, transfers) in ranks.items():
            busy = sum(a["dur"] for a in acts) - sum(r["dur"] for r in transfers if r["name"].startswith("recv"))
            wall.append(1 - busy / (end - start))
        transfers = [t for _, ts in ranks.values() for t in ts]
        comm["send_us"].append(sum(t["args"]["cpu_us"] for t in transfers if t["name"].startswith("send")))
        comm["recv_us"].append(sum(t["args"]["cpu_us"] for t in transfers if t["name"].startswith("recv")))
        comm["bytes"].append(sum(t["args"].get("bytes", 0) for t in transfers if t["name"].startswith("send")))
        comm["compute_us"].append(sum(costs.values()))
    # The median step: every action at the median of its cost over the steps,
    # which keeps what differs between actions and stages and drops the
    # moments another process took the core's caches.
    median_cost = {k: statistics.median(v) for k, v in samples.items()}
    order = {rank: [a["name"] for a in acts] for rank, (acts, _) in steps[-1].items()}
    kinds = {}
    for (rank, name), v in median_cost.items():
        kinds.setdefault((rank, name[0]), []).append(v)
    stage_costs = {k: statistics.median(v) for k, v in kinds.items()}
    return (statistics.mean(wall), statistics.median(per_step), replay(order, median_cost),
            {k: statistics.median(v) for k, v in comm.items()}, stage_costs)


def replay(order, cost):
    """The bubble (idle over total, all ranks together) that the schedule
    gives with these action costs, as if each rank had a core of its own: F(m)
    on rank r starts after F(m) on rank r-1, B(m) after B(m) on rank r+1, each
    after the rank's previous action. Sends are free."""
    end = {}
    free = {r: 0.0 for r in order}
    pending = {r: list(order[r]) for r in order}
    while any(pending.values()):
        progress = False
        for r in sorted(order):
            while pending[r]:
                name = pending[r][0]
                dep = (r - 1, name) if name[0] == "F" and r > 0 else (r + 1, name) if name[0] == "B" and r + 1 < STAGES else None
                if dep is not None and dep not in end:
                    break
                start = max(free[r], end.get(dep, 0.0))
                end[(r, name)] = free[r] = start + cost[(r, name)]
                pending[r].pop(0)
                progress = True
        if not progress:
            sys.exit("replay: the schedule deadlocks")
    span = max(free.values())
    busy = sum(cost[(r, n)] for r in order for n in order[r])
    return 1 - busy / (span * len(order))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--steps", type=int, default=11)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--features", type=int, default=16,
                        help="input width: small, so the embedding adds little to stage 0")
    parser.add_argument("--micro_batch", type=int, nargs="+", default=[128, 32],
                        help="samples per micro-batch; a table for each")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every case; the median is shown")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--no_bind", action="store_true", help="leave workers unpinned (no --bind_cores)")
    args = parser.parse_args()
    if args.steps < 2 or args.repeats < 1 or not 1 <= args.stages <= BLOCKS:
        parser.error(f"--steps must be at least 2 (the first is warm-up), --repeats at least 1, "
                     f"--stages in 1..{BLOCKS}")
    global STAGES
    STAGES = args.stages
    tmp = tempfile.mkdtemp(prefix="strata-bubble-")
    program = os.path.join(tmp, "resmlp.pbtxt")
    # gen --stages balances the stages by estimated work: the (cheap)
    # embedding joins stage 0 and the (cheap) head and loss the last stage,
    # so every stage runs BLOCKS / STAGES blocks.
    gen = subprocess.run([args.strata, "gen", "resmlp", "--blocks", str(BLOCKS), "--stages", str(STAGES),
                          "--layers", f"{args.features},{args.width},10", "--optimizer", "sgd"],
                         capture_output=True, text=True, check=True)
    open(program, "w").write(gen.stdout)
    print(f"{BLOCKS} residual blocks on {STAGES} stages, width {args.width}, {args.features} features, "
          f"{args.threads} thread(s) per rank, {os.cpu_count()} cores, "
          f"{'unpinned' if args.no_bind else '--bind_cores'}, {args.steps - 1} measured steps")
    results = []
    for mb in args.micro_batch:
        results.append(table(args, tmp, program, mb))
    print("RESULT " + " ".join(f"micro_batch={mb} misses={misses} spread={spread:.3f}" for mb, misses, spread in results))


def table(args, tmp, program, mb):
    """One table: every schedule and micro-batch count at micro-batch size `mb`.
    Each case runs `--repeats` times, the cases interleaved, so a spell in
    which another process holds a core falls on one run of several cases
    rather than on every run of one; the row shows the run with the median
    ratio, and the range of the ratios."""
    print(f"\nmicro-batches of {mb} samples, median of {args.repeats} runs")
    print(f"{'schedule':>12} {'M':>3} {'wall-clock':>10} {'per-step':>9} {'median-step':>11} {'formula':>8} "
          f"{'ratio':>6} {'(range)':>11}  goal within 10%  {'compiler predicted':>18}")
    cases = [(schedule, m) for schedule in ("F_THEN_B", "ONE_F_ONE_B") for m in (4, 8, 16)]
    results = {case: [] for case in cases}
    for _ in range(args.repeats):
        for schedule, m in cases:
            strategy = os.path.join(tmp, f"{schedule}_{m}_{mb}.pbtxt")
            open(strategy, "w").write(
                f"pipeline {{ micro_batch_size: {mb} accumulate_steps: {m} schedule: {schedule} }}\n")
            trace = os.path.join(tmp, f"{schedule}_{m}_{mb}.json")
            run(args.strata, program, strategy, args.steps, trace, args.threads, not args.no_bind)
            results[(schedule, m)].append(bubble_from_trace(trace))
    misses = 0
    spreads = []
    for schedule, m in cases:
        formula = (STAGES - 1) / (m + STAGES - 1)
        runs = sorted(results[(schedule, m)], key=lambda r: r[2])
        ratios = [r[2] / formula for r in runs]
        wall, per_step, median_step, comm, stage_costs = runs[(len(runs) - 1) // 2]  # the lower middle when even
        ratio = median_step / formula
        ok = abs(ratio - 1) <= 0.10
        misses += not ok
        spreads.extend(max(spread(r[4], kind) for kind in "FB") for r in runs)
        strategy = os.path.join(tmp, f"{schedule}_{m}_{mb}.pbtxt")
        predicted = predicted_bubble(args.strata, program, strategy)
        span = f"{ratios[0]:.2f}-{ratios[-1]:.2f}"
        print(f"{schedule:>12} {m:>3} {wall:10.3f} {per_step:9.3f} {median_step:11.3f} {formula:8.3f} "
              f"{ratio:6.2f} {span:>11}  {'PASS' if ok else 'MISS':>15}  {predicted:18.3f}")
    costs = ", ".join(f"stage {r}: F {stage_costs[(r, 'F')]:.0f} B {stage_costs[(r, 'B')]:.0f}"
                      for r in range(STAGES))
    print(f"median action CPU us (ONE_F_ONE_B, M=16) {costs}")
    # The formula holds for stages of equal cost; how far this machine's
    # stages were from that (the largest max/min of a forward or a backward
    # over the stages, the median over the runs).
    worst = statistics.median(spreads)
    print(f"stage cost spread (max/min over the stages of the median forward or backward, median of the runs): "
          f"{worst:.3f}")
    print(f"communication (ONE_F_ONE_B, M=16, median step, all ranks): {comm['bytes'] / 1e6:.2f} MB over loopback; "
          f"CPU in sends {comm['send_us'] / 1e3:.2f} ms and in receives {comm['recv_us'] / 1e3:.2f} ms "
          f"against {comm['compute_us'] / 1e3:.2f} ms in forward and backward actions (which include them): "
          f"{(comm['send_us'] + comm['recv_us']) / comm['compute_us']:.1%}")
    return mb, misses, worst


def spread(stage_costs, kind):
    values = [v for (r, k), v in stage_costs.items() if k == kind]
    return max(values) / min(values)


if __name__ == "__main__":
    main()
