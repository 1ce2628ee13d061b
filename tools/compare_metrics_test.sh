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
# Resumed from a checkpoint of step 3: both merged, so step against step.
grep -E '"step": [4-6],' "$tmp/ref.jsonl" >"$tmp/resumed.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/resumed.jsonl" "$tmp/ref.jsonl") || fail "exit $?: $out"
echo "$out"
echo "$out" | grep -q "both under gradient merge of 2 steps: compared step by step" || fail "not compared step by step"
echo "$out" | grep -q ": 3 steps, bit-identical=True" || fail "the resumed run is not bit-identical"
echo "$out" | grep -q "eval test step 6: loss 1.125000 vs 1.125000, accuracy 0.5000 vs 0.5000" ||
  fail "the evaluations are not paired by step"
echo "$out" | grep -q "step 2:" && fail "an evaluation only one file has is compared"
# A resumed merged run against one device (an update a step, its loss each
# update's mean): update 2, of which the file has only step 4, is left out;
# k = 2 from the updates' ends, also when the file holds one update only.
printf '%s\n' '{"step": 1, "loss": 2.375}' '{"step": 2, "loss": 1.75}' '{"step": 3, "loss": 1.125}' >"$tmp/one.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/resumed.jsonl" "$tmp/one.jsonl") || fail "exit $?: $out"
echo "$out" | grep -q "gradient merge, 3 steps, 1 updates; each update's loss is the mean of its 2 steps' losses; update 2 left out" ||
  fail "the partial update is not left out: $out"
echo "$out" | grep -q ": 1 updates, bit-identical=True" || fail "update 3 is not one device's step 3: $out"
grep -E '"step": [56],' "$tmp/ref.jsonl" >"$tmp/last.jsonl"
grep -E '"step": 6,' "$tmp/ref.jsonl" | head -1 >"$tmp/partial.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/last.jsonl" "$tmp/one.jsonl") || fail "exit $?: $out"
echo "$out" | grep -q "gradient merge, 2 steps, 1 updates; each update's loss is the mean of its 2 steps' losses" ||
  fail "k is not 2 from one update: $out"
if out=$(/usr/bin/python3 "$cm" "$tmp/partial.jsonl" "$tmp/one.jsonl" 2>&1); then fail "a lone partial update compared: $out"; fi
echo "$out" | grep -q "update 3 left out" || fail "the lone partial update is not named: $out"
# A different loss in update 3 is found there (mean 1.0625 against 1.125).
sed 's/"loss": 1.0,/"loss": 0.875,/' "$tmp/ref.jsonl" >"$tmp/other.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/other.jsonl" "$tmp/one.jsonl") || fail "exit $?: $out"
echo "$out" | grep -q "3 updates, bit-identical=False, max rel diff 0.0556 at update 3, first update over 1e-4: 3" ||
  fail "the difference is not at update 3: $out"
# A run resumed into its own file (--load appends): steps 4 and 5 again,
# then 6; the repeated steps replace the first ones, and update 2, which the
# resumed run saw only the end of, is left out.
{ grep -E '"step": [1-5],' "$tmp/ref.jsonl"; grep -E '"step": [4-6],' "$tmp/ref.jsonl"; } >"$tmp/appended.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/appended.jsonl" "$tmp/one.jsonl") || fail "exit $?: $out"
echo "$out" | grep -q "gradient merge, 6 steps, 2 updates; each update's loss is the mean of its 2 steps' losses; update 2 left out" ||
  fail "the appended resume is misread: $out"
echo "$out" | grep -q ": 2 updates, bit-identical=True" || fail "the appended resume differs: $out"
# Merges of different k are compared update against update, not step by step.
sed 's/, "optimizer_step": [0-9]*//' "$tmp/ref.jsonl" | awk '/"step": 4,/ {sub(/}$/, ", \"optimizer_step\": 1}")} {print}' >"$tmp/k4.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/k4.jsonl" "$tmp/ref.jsonl" 2>&1) || true
echo "$out" | grep -q "compared step by step" && fail "merges of 4 and 2 steps compared step by step: $out"
# Evaluations alone (two --eval_only files) are compared; an eval-only
# summary appended to a run's file does not replace the training's.
printf '%s\n' '{"eval": "test", "step": 6, "epoch": 1, "loss": 0.5, "accuracy": 0.25}' \
  '{"summary": {"steps": 6, "seconds": 0.5, "measured_peak_bytes": 10, "predicted_peak_bytes": 20, "eval_only": true}}' \
  >"$tmp/eval_a.jsonl"
sed 's/"loss": 0.5/"loss": 0.75/' "$tmp/eval_a.jsonl" >"$tmp/eval_b.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/eval_a.jsonl" "$tmp/eval_b.jsonl") || fail "evaluations alone: exit $?: $out"
echo "$out" | grep -q "no step in both; 1 evaluations, bit-identical=False" || fail "evaluations alone: $out"
echo "$out" | grep -q "eval test step 6: loss 0.500000 vs 0.750000, accuracy 0.2500 vs 0.2500" || fail "evaluations alone: $out"
{ cat "$tmp/ref.jsonl"; echo '{"summary": {"steps": 6, "seconds": 9.5, "measured_peak_bytes": 1, "predicted_peak_bytes": 2}}'; cat "$tmp/eval_a.jsonl"; } >"$tmp/with_eval.jsonl"
out=$(/usr/bin/python3 "$cm" "$tmp/with_eval.jsonl" "$tmp/with_eval.jsonl") || fail "exit $?: $out"
echo "$out" | grep -q "seconds 9.50 vs 9.50" || fail "the eval-only summary replaced the training's: $out"
# Nothing in common: an error.
: >"$tmp/empty.jsonl"
if out=$(/usr/bin/python3 "$cm" "$tmp/empty.jsonl" "$tmp/ref.jsonl" 2>&1); then fail "an empty file compared: $out"; fi
echo "$out" | grep -q "nothing compared" || fail "no reason given: $out"
echo PASS
