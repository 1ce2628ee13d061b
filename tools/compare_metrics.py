#!/usr/bin/env python3
"""Compares two `strata run --metrics` files step by step.

    python3 tools/compare_metrics.py A.jsonl B.jsonl [--summed_loss]

Prints the steps both have, whether their losses are bit-identical, the
largest relative difference (and the first step above 1e-4), each eval's
loss and accuracy side by side (evaluations of one set after one step), and
the two summaries' seconds and peaks; exits 1 when the files share neither
a step nor an evaluation. Used to set a GPU run beside the CPU run of the
same program and seed, a resumed run beside the uninterrupted one, or the
evaluations of one checkpoint under two layouts (`run --eval_only`, whose
summary line a training summary in the same file is preferred to).

A run under gradient merge (its update steps carry "optimizer_step") is
compared per optimizer update: the mean of the losses of the k steps that
one update merged, against the other run's update of that number (a run
without gradient merge updates on every step); a first update the file
has only the last steps of (a run resumed mid-update) is left out. Two
runs under gradient merge are compared step by step. With --summed_loss (a loss
that is a sum over samples, as `strata check` says) an update's loss is the
sum of its k steps' losses, one device's sum over the merged batch.
"""
import json, sys
args = [a for a in sys.argv[1:] if not a.startswith("--")]
flags = [a for a in sys.argv[1:] if a.startswith("--")]
if len(args) != 2 or any(f != "--summed_loss" for f in flags):
    sys.exit("usage: compare_metrics.py A.jsonl B.jsonl [--summed_loss]")
summed = "--summed_loss" in flags
sys.argv = [sys.argv[0]] + args
def load(p):
    steps, evals, summ, updates, pending, merged = {}, {}, None, {}, [], False
    sizes = {}  # update -> how many of its steps the file has
    ends = []  # (step, update) of each update's last step
    for line in open(p):
        r = json.loads(line)
        if "summary" in r:
            # An --eval_only appended to a run's file: the training's summary stays.
            if summ is None or not r["summary"].get("eval_only") or summ.get("eval_only"): summ = r["summary"]
        elif "eval" in r: evals[(r["eval"], r["step"])] = r
        elif "loss" in r:
            if steps and r["step"] <= max(steps):
                # A run resumed into the same file (--load appends): its steps
                # from here replace the file's, the updates they end too.
                for st in [st for st in steps if st >= r["step"]]: del steps[st]
                for u in [u for st, u in ends if st >= r["step"]]: del updates[u], sizes[u]
                ends = [(st, u) for st, u in ends if st < r["step"]]
                pending = []
            steps[r["step"]] = r["loss"]
            pending.append(r["loss"])
            if "optimizer_step" in r:
                merged = True
                updates[r["optimizer_step"]] = sum(pending) / (1 if summed else len(pending))
                sizes[r["optimizer_step"]] = len(pending)
                ends.append((r["step"], r["optimizer_step"]))
                pending = []
    partial, k = [], 1
    if merged:
        # A run resumed from a checkpoint taken mid-update has only the last
        # steps of its first update: that update's loss is not comparable.
        # k: the steps between two updates' ends, or with one update in the
        # file, its step over its number.
        gaps = [s2 - s1 for (s1, _), (s2, _) in zip(ends, ends[1:])]
        k = max(1, min(gaps) if gaps else ends[0][0] // max(ends[0][1], 1))
        partial = [u for u, n in sizes.items() if n < k]
        for u in partial: del updates[u]
    return steps, evals, summ, (updates if merged else None), partial, k
a, ea, sa, ua, pa, ka = load(sys.argv[1]); b, eb, sb, ub, pb, kb = load(sys.argv[2])
if ua is not None and ub is not None and ka == kb:
    # Both under the same gradient merge (a resumed run and the
    # uninterrupted one): step against step.
    print(f"both under gradient merge of {ka} steps: compared step by step")
    ua = ub = None
if ua is not None or ub is not None:
    for name, steps, u, part, k in ((sys.argv[1], a, ua, pa, ka), (sys.argv[2], b, ub, pb, kb)):
        if u is not None:
            left = f"; update {', '.join(map(str, part))} left out: the file has only its last steps (resumed mid-update)" if part else ""
            print(f"{name}: gradient merge, {len(steps)} steps, {len(u)} updates; each update's loss is the {'sum' if summed else 'mean'} of its {k} steps' losses{left}")
    if ua is not None: a = ua
    if ub is not None: b = ub
unit = "updates" if ua is not None or ub is not None else "steps"
common = sorted(set(a) & set(b))
common_evals = set(ea) & set(eb)
if not common and not common_evals:
    sys.exit(f"{sys.argv[1]} vs {sys.argv[2]}: no {unit[:-1]} in both ({len(a)} and {len(b)} {unit}) and no evaluation: nothing compared")
if common:
    worst, worst_step, first_over = 0.0, None, None
    for s in common:
        rel = abs(a[s] - b[s]) / max(abs(b[s]), 1e-30)
        if rel > worst: worst, worst_step = rel, s
        if first_over is None and rel > 1e-4: first_over = s
    same = all(a[s] == b[s] for s in common)
    print(f"{sys.argv[1]} vs {sys.argv[2]}: {len(common)} {unit}, bit-identical={same}, max rel diff {worst:.3g} at {unit[:-1]} {worst_step}, first {unit[:-1]} over 1e-4: {first_over}")
else:
    same = all(ea[k]["loss"] == eb[k]["loss"] and ea[k].get("accuracy") == eb[k].get("accuracy") for k in common_evals)
    print(f"{sys.argv[1]} vs {sys.argv[2]}: no {unit[:-1]} in both; {len(common_evals)} evaluations, bit-identical={same}")
for key in sorted(common_evals, key=lambda k: (k[1], k[0])):  # evaluations of the same set after the same step
    x, y = ea[key], eb[key]
    # (accuracy only where the program fetches one)
    acc = f", accuracy {x['accuracy']:.4f} vs {y['accuracy']:.4f}" if "accuracy" in x and "accuracy" in y else ""
    print(f"  eval {x['eval']} step {x['step']}: loss {x['loss']:.6f} vs {y['loss']:.6f}{acc}")
if sa and sb: print(f"  seconds {sa['seconds']:.2f} vs {sb['seconds']:.2f}; measured peak {sa['measured_peak_bytes']} vs {sb['measured_peak_bytes']}; predicted {sa['predicted_peak_bytes']} vs {sb['predicted_peak_bytes']}")
