#!/usr/bin/env bash
# compare_metrics.py on hand-written metrics files: a run resumed mid-update
# under gradient merge equals the uninterrupted one (its partial first update
# left out, evaluations paired by step), a difference is found where it is,
# and files that share no step are an error, not "bit-identical".
set -euo pipefail
cm=$1
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }
# k = 2: updates end at steps 2, 4, 6; an evaluation after steps 2 and 6.
cat >"$tmp/ref.jsonl" <<'J'
{"step": 1, "epoch": 1, "loss": 2.5}
{"step": 2, "epoch": 1, "loss": 2.25, "optimizer_step": 1}
{"eval": "test", "step": 2, "epoch": 1, "loss": 2.0, "accuracy": 0.25}
{"step": 3, "epoch": 1, "loss": 2.0}
{"step": 4, "epoch": 1, "loss": 1.5, "optimizer_step": 2}
{"step": 5, "epoch": 1, "loss": 1.25}
{"step": 6, "epoch": 1, "loss": 1.0, "optimizer_step": 3}
{"eval": "test", "step": 6, "epoch": 1, "loss": 1.125, "accuracy": 0.5}
J
# Resumed from a checkpoint of step 3: update 2 has only its step 4.
grep -E '"step": [4-6],' "$tmp/ref.jsonl" >"$tmp/resumed.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/resumed.jsonl" "$tmp/ref.jsonl") || fail "exit $?: $out"
echo "$out"
echo "$out" | grep -q "gradient merge, 3 steps, 1 updates; each update's loss is the mean of its 2 steps' losses; update 2 left out" ||
  fail "the partial update is not left out"
echo "$out" | grep -q ": 1 updates, bit-identical=True" || fail "the resumed run is not bit-identical"
echo "$out" | grep -q "eval test step 6: loss 1.125000 vs 1.125000, accuracy 0.5000 vs 0.5000" ||
  fail "the evaluations are not paired by step"
echo "$out" | grep -q "step 2:" && fail "an evaluation only one file has is compared"
# A different loss in update 3 is found there (mean 1.125 against 1.0625).
sed 's/"loss": 1.0,/"loss": 0.875,/' "$tmp/ref.jsonl" >"$tmp/other.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/other.jsonl" "$tmp/ref.jsonl") || fail "exit $?: $out"
echo "$out" | grep -q "3 updates, bit-identical=False, max rel diff 0.0556 at update 3, first update over 1e-4: 3" ||
  fail "the difference is not at update 3: $out"
# Nothing in common: an error.
: >"$tmp/empty.jsonl"
if out=$(/usr/bin/python3 "$cm" "$tmp/empty.jsonl" "$tmp/ref.jsonl" 2>&1); then fail "an empty file compared: $out"; fi
echo "$out" | grep -q "nothing compared" || fail "no reason given: $out"
echo PASS
