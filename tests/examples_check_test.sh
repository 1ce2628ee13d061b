#!/usr/bin/env bash
# Every example compiles: each program alone, and each pipeline program with
# the strategies the README runs it with. The hybrid strategy (pp2 x dp2,
# gradient merge, recompute) must give 4 ranks in two dp groups, an update of
# 64 samples (the single-device examples' batch), activations on stage 0 below
# the same strategy's without recompute, and the single device's losses.
set -uo pipefail
strata=$1
examples=$(dirname "$2")  # any file of examples/
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for p in "$examples"/*.pbtxt; do
  case $p in *.strategy.pbtxt) continue ;; esac
  "$strata" check "$p" >"$tmp/out" 2>&1 || fail "strata check $p: $(cat "$tmp/out")"
  echo "ok: $p"
done
for pair in mlp_pp2:pp2 alexnet_fashion_pp2:pp2 gpt_tiny_pp2:pp2 convnet_fashion_pp2:pp2 convnet_fashion_pp2:convnet_fashion_hybrid; do
  p=$examples/${pair%%:*}.pbtxt s=$examples/${pair#*:}.strategy.pbtxt
  "$strata" check "$p" --strategy "$s" >"$tmp/out" 2>&1 || fail "strata check $p --strategy $s: $(cat "$tmp/out")"
  echo "ok: $p with $s"
done

# The hybrid: its check output.
hybrid=$examples/convnet_fashion_hybrid.strategy.pbtxt
out=$("$strata" check "$examples/convnet_fashion_pp2.pbtxt" --strategy "$hybrid" 2>&1) || fail "check: $out"
echo "$out"
echo "$out" | grep -q "passes: .*recompute.*gradient-merge, data-parallel" || fail "recompute, gradient merge or data parallel did not run"
echo "$out" | grep -q "global batch 32 = 2 micro-batch(es) of 8 x 2 data-parallel replicas, ONE_F_ONE_B schedule, 4 rank(s)" ||
  fail "not 4 ranks of 2 micro-batches of 8 on each of 2 replicas"
echo "$out" | grep -q "loss: a mean over samples (proved from its ops)" || fail "the loss's form is not said"
echo "$out" | grep -q "gradient merge: the optimizer runs once every 2 steps, on 64 samples" ||
  fail "an update does not see the single device's 64 samples"
echo "$out" | grep -A2 "^  ranks 0, 2 (stage 0's 2 data-parallel replicas):" | grep -q "dp group 1: ranks 0, 2" ||
  fail "ranks 0 and 2 not in dp group 0, 2"
echo "$out" | grep -A2 "^  ranks 1, 3 (stage 1's 2 data-parallel replicas):" | grep -q "dp group 2: ranks 1, 3" ||
  fail "ranks 1 and 3 not in dp group 1, 3"
activations() { echo "$1" | grep "^  stage $2:" | sed -n 's/.*predicted activations \([0-9.]*\) MiB.*/\1/p'; }
grep -v recompute "$hybrid" >"$tmp/no_recompute.strategy.pbtxt"
plain=$("$strata" check "$examples/convnet_fashion_pp2.pbtxt" --strategy "$tmp/no_recompute.strategy.pbtxt" 2>&1) || fail "check without recompute: $plain"
a=$(activations "$out" 0) b=$(activations "$plain" 0)
[ -n "$a" ] && [ -n "$b" ] || fail "no predicted activations in the stage 0 lines"
awk -v a="$a" -v b="$b" 'BEGIN { exit !(a < b) }' || fail "stage 0 activations $a MiB with recompute, $b MiB without"
echo "stage 0 activations: $a MiB with recompute, $b MiB without"

# Six steps on 4 ranks (synthetic data) against one device merging the same steps.
cmp=$("$strata" run "$examples/convnet_fashion_pp2.pbtxt" --strategy "$hybrid" --nproc 4 --steps 6 --quiet \
  --compare_single --log_dir "$tmp/log" 2>&1) || fail "run: $cmp"
echo "$cmp" | tail -8
worst=$(echo "$cmp" | sed -n 's/^max relative difference \([0-9.e+-]*\) over 6 steps$/\1/p')
[ -n "$worst" ] || fail "no comparison over 6 steps"
awk -v w="$worst" 'BEGIN { exit !(w < 1e-4) }' || fail "the hybrid's losses part from one device's by $worst"

# --compare_single's reference has the run's arithmetic and steps:
# (a) under F16 mixed precision it is one device in F16 too (a scale of
#     2^100 overflows every update on both sides: the losses stay equal;
#     a float32 reference would train and part from them);
# (b) a run resumed from a checkpoint compares steps 4..6 with a reference
#     resumed from the same checkpoint (one device loads the pipeline's);
# (c) one process without --metrics compares through a temporary file.
# (A failing --load is said once, before the workers start.)
pp="$tmp/pp.strategy.pbtxt"
printf '%s\n' 'pipeline { micro_batch_size: 8 accumulate_steps: 2 }' >"$pp"
cat "$pp" - >"$tmp/f16.strategy.pbtxt" <<'EOT'
mixed_precision { dtype: F16 loss_scaling { init_scale: 1.2676506e30 } }
EOT
worst_of() { sed -n "s/^max relative difference \([0-9.e+-]*\) over $2 steps\$/\1/p" <<<"$1"; }
f16=$("$strata" run "$examples/convnet_fashion_pp2.pbtxt" --strategy "$tmp/f16.strategy.pbtxt" --nproc 2 --steps 4 \
  --quiet --compare_single --log_dir "$tmp/log" 2>&1) || fail "F16 run: $f16"
w=$(worst_of "$f16" 4)
[ -n "$w" ] && awk -v w="$w" 'BEGIN { exit !(w < 1e-6) }' || fail "F16 against its reference: $f16"
"$strata" run "$examples/convnet_fashion_pp2.pbtxt" --strategy "$pp" --nproc 2 --steps 6 --quiet \
  --save "$tmp/ck" --save_every 3 --log_dir "$tmp/log" >/dev/null 2>&1 || fail "run saving step 3"
resumed=$("$strata" run "$examples/convnet_fashion_pp2.pbtxt" --strategy "$pp" --nproc 2 --steps 6 --quiet \
  --load "$tmp/ck/step-3" --compare_single --log_dir "$tmp/log" 2>&1) || fail "resumed run: $resumed"
grep -qE "^ +4 +[0-9.]+ +[0-9.]+ " <<<"$resumed" && ! grep -qE "^ +1 +[0-9.]+ +[0-9.]+ " <<<"$resumed" ||
  fail "the resumed comparison does not start at step 4: $resumed"
w=$(worst_of "$resumed" 3)
[ -n "$w" ] && awk -v w="$w" 'BEGIN { exit !(w < 1e-4) }' || fail "resumed against its reference: $resumed"
one=$("$strata" run "$examples/convnet_fashion_pp2.pbtxt" --steps 2 --batch_size 16 --quiet --compare_single 2>&1) ||
  fail "one process --compare_single without --metrics: $one"
[ -n "$(worst_of "$one" 2)" ] || fail "one process printed no comparison: $one"

# A --load with no checkpoint is one error line before any worker starts.
if missing=$("$strata" run "$examples/convnet_fashion_pp2.pbtxt" --strategy "$pp" --nproc 2 --steps 2 --quiet \
  --load "$tmp/none" --log_dir "$tmp/log" 2>&1); then fail "a missing --load folder passed"; fi
[ "$(grep -c '^error:' <<<"$missing")" = 1 ] && ! grep -q '^\[rank' <<<"$missing" &&
  grep -q "^error: --load $tmp/none: " <<<"$missing" || fail "a missing --load folder: $missing"
echo "PASS"
