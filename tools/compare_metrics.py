#!/usr/bin/env python3
"""Compares two `strata run --metrics` files step by step.

    python3 tools/compare_metrics.py A.jsonl B.jsonl

Prints the steps both have, whether their losses are bit-identical, the
largest relative difference (and the first step above 1e-4), each eval's
loss and accuracy side by side, and the two summaries' seconds and peaks.
Used to set a GPU run beside the CPU run of the same program and seed.
"""
import json, sys
def load(p):
    steps, evals, summ = {}, [], None
    for line in open(p):
        r = json.loads(line)
        if "summary" in r: summ = r["summary"]
        elif "eval" in r: evals.append(r)
        elif "loss" in r: steps[r["step"]] = r["loss"]
    return steps, evals, summ
a, ea, sa = load(sys.argv[1]); b, eb, sb = load(sys.argv[2])
common = sorted(set(a) & set(b))
worst, worst_step, first_over = 0.0, None, None
for s in common:
    rel = abs(a[s] - b[s]) / max(abs(b[s]), 1e-30)
    if rel > worst: worst, worst_step = rel, s
    if first_over is None and rel > 1e-4: first_over = s
same = all(a[s] == b[s] for s in common)
print(f"{sys.argv[1]} vs {sys.argv[2]}: {len(common)} steps, bit-identical={same}, max rel diff {worst:.3g} at step {worst_step}, first step over 1e-4: {first_over}")
for x, y in zip(ea, eb): print(f"  eval {x['eval']} step {x['step']}: loss {x['loss']:.6f} vs {y['loss']:.6f}, accuracy {x['accuracy']:.4f} vs {y['accuracy']:.4f}")
if sa and sb: print(f"  seconds {sa['seconds']:.2f} vs {sb['seconds']:.2f}; measured peak {sa['measured_peak_bytes']} vs {sb['measured_peak_bytes']}; predicted {sa['predicted_peak_bytes']} vs {sb['predicted_peak_bytes']}")
