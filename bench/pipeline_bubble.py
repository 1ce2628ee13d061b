"""Pipeline bubble: measured against the formula (K-1)/(M+K-1).

Four stages of equal cost (a residual MLP with the same blocks on every
stage), micro-batch counts 4, 8 and 16, both schedules. Each run writes a
Chrome trace; from it, per rank and per step, busy = the time inside forward
and backward actions minus the time their receives waited, and the bubble is
1 - busy / (the step's makespan over all ranks). The median over steps after
the first (warm-up) is compared with the formula. Also the cost of pipeline
communication: the time one activation transfer takes over loopback (the
traced receive of a micro-batch whose sender finished long ago) against the
compute of the stage that produced it.

"wall-clock" is what this machine gave; with fewer cores than stages the ranks
share cores and it overstates the bubble. "replayed" re-times each action's own
CPU time (from the trace) through the schedule's dependencies, as if every
rank had a core: the bubble the schedule itself costs on these op times.

Run: bazel run //bench:pipeline_bubble -- [--steps N] [--width W]
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


def place_evenly(text):
    """Equal stages: blocks 2k and 2k+1 on stage k; the (cheap) embedding
    joins stage 0 and the (cheap) head and loss the last stage."""
    out = []
    for line in text.splitlines():
        if line.startswith("op {"):
            name = line.split('output: ["')[1].split('"')[0]
            if name.startswith("embed") or name == "h0":
                stage = 0
            elif name.startswith("block"):
                stage = int(name[len("block"):].split(".")[0]) * STAGES // BLOCKS
            elif name.startswith("h") and name[1:].isdigit():
                stage = (int(name[1:]) - 1) * STAGES // BLOCKS
            else:
                stage = STAGES - 1
            line = line[: line.rindex("}")] + f'device: "gpu:{stage}" }}'
        out.append(line)
    return "\n".join(out) + "\n"


def run(strata, program, strategy, steps, trace, threads):
    env = dict(os.environ, STRATA_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(threads))
    cmd = [strata, "run", program, "--strategy", strategy, "--nproc", str(STAGES), "--steps", str(steps),
           "--data", "synthetic:classes=10,size=8192", "--quiet", "--trace", trace]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"strata failed: {out.stderr}")


def bubble_from_trace(path, micro_batches):
    events = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    per_rank = {}
    for e in events:
        per_rank.setdefault(e["tid"], []).append(e)
    # Split each rank's actions into steps at every OPT action.
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
            elif e["cat"] == "comm" and e["name"].startswith("recv"):
                comm.append(e)
    bubbles, replayed, transfer_us, compute_us = [], [], [], []
    for step, ranks in sorted(steps.items()):
        if step == 0 or len(ranks) != STAGES:
            continue
        replayed.extend(replay(ranks))
        start = min(a["ts"] for acts, _ in ranks.values() for a in acts)
        end = max(a["ts"] + a["dur"] for acts, _ in ranks.values() for a in acts)
        span = end - start
        for rank, (acts, recvs) in ranks.items():
            busy = sum(a["dur"] for a in acts) - sum(r["dur"] for r in recvs)
            bubbles.append(1 - busy / span)
            compute_us.extend(a["dur"] for a in acts if a["name"].startswith("F"))
            transfer_us.extend(r["dur"] for r in recvs)
    return (statistics.median(bubbles), statistics.median(replayed), statistics.median(transfer_us or [0]),
            statistics.median(compute_us or [1]))


def replay(ranks):
    """The bubble the schedule gives with the measured compute time of every
    action, as if each rank had a core of its own: F(m) on rank r starts after
    F(m) on rank r-1, B(m) after B(m) on rank r+1, each after the rank's
    previous action."""
    cost = {}
    order = {}
    for rank, (acts, recvs) in ranks.items():
        waits = {}
        for r in recvs:
            for a in acts:
                if a["ts"] <= r["ts"] <= a["ts"] + a["dur"]:
                    waits[id(a)] = waits.get(id(a), 0) + r["dur"]
        order[rank] = [a["name"] for a in acts]
        for a in acts:
            # The action's own CPU time when traced: neither waiting nor sharing a core counts.
            cpu = a.get("args", {}).get("cpu_us")
            cost[(rank, a["name"])] = cpu if cpu is not None else max(a["dur"] - waits.get(id(a), 0), 0)
    end = {}
    free = {r: 0.0 for r in ranks}
    pending = {r: list(order[r]) for r in ranks}
    while any(pending.values()):
        progress = False
        for r in sorted(ranks):
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
            break
    span = max(free.values())
    return [1 - sum(cost[(r, n)] for n in order[r]) / span for r in ranks]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--strata", required=True)
    parser.add_argument("--steps", type=int, default=11)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--features", type=int, default=16,
                        help="input width: small, so the embedding adds little to stage 0")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--stages", type=int, default=4)
    args = parser.parse_args()
    global STAGES
    STAGES = args.stages
    tmp = tempfile.mkdtemp(prefix="strata-bubble-")
    program = os.path.join(tmp, "resmlp.pbtxt")
    gen = subprocess.run([args.strata, "gen", "resmlp", "--blocks", str(BLOCKS),
                          "--layers", f"{args.features},{args.width},10", "--optimizer", "sgd"],
                         capture_output=True, text=True, check=True)
    open(program, "w").write(place_evenly(gen.stdout))
    print(f"{STAGES} stages of {BLOCKS // STAGES} residual blocks each, width {args.width}, micro-batches of 32, "
          f"{args.threads} thread(s) per rank, {os.cpu_count()} cores")
    print(f"{'schedule':>12} {'M':>3} {'wall-clock':>10} {'replayed':>9} {'formula':>8} {'replayed/formula':>17}")
    for schedule in ("F_THEN_B", "ONE_F_ONE_B"):
        for m in (4, 8, 16):
            strategy = os.path.join(tmp, f"{schedule}_{m}.pbtxt")
            open(strategy, "w").write(f"pipeline {{ micro_batch_size: 32 accumulate_steps: {m} schedule: {schedule} }}\n")
            trace = os.path.join(tmp, f"{schedule}_{m}.json")
            run(args.strata, program, strategy, args.steps, trace, args.threads)
            measured, replayed, transfer, compute = bubble_from_trace(trace, m)
            formula = (STAGES - 1) / (m + STAGES - 1)
            print(f"{schedule:>12} {m:>3} {measured:10.3f} {replayed:9.3f} {formula:8.3f} {replayed / formula:17.2f}")
    print(f"median receive {transfer:.0f} us against a forward action of {compute:.0f} us "
          f"(ratio {transfer / max(compute, 1):.3f}; receives include waiting for the sender)")


if __name__ == "__main__":
    main()
