#!/usr/bin/env bash
# `strata check` on a pipeline says what a user needs to balance it: each
# stage's share of the estimated work, each rank's predicted peak and bubble,
# and the schedule diagram; with data parallelism, each rank's dp group, its
# gradient buckets and the bytes their ring allreduce sends; with recompute,
# each rank's activation peak with and without it. The AlexNet example, placed by `strata gen
# alexnet --stages 2`, splits its convolutions so that neither stage has
# much more than half the work; moving conv4 onto stage 0 by hand makes
# stage 0 the heavy one, and check says so: rank 1 then idles most of the step.
set -uo pipefail
strata=$1
program=$2
strategy=$3
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {
  out=$("$strata" check "$1" --strategy "$strategy" 2>&1) || fail "check failed: $out"
  echo "$out"
  s0=$(echo "$out" | grep "^  stage 0:" | sed -n 's/.*, \([0-9]*\)% of the work.*/\1/p')
  s1=$(echo "$out" | grep "^  stage 1:" | sed -n 's/.*, \([0-9]*\)% of the work.*/\1/p')
  [ -n "$s0" ] && [ -n "$s1" ] || fail "no work shares in the stage lines"
  [ $((s0 + s1)) -ge 99 ] && [ $((s0 + s1)) -le 101 ] || fail "work shares $s0% + $s1% do not add up to 100%"
  b0=$(echo "$out" | grep "^  rank 0:" | sed -n 's/.*bubble \([0-9.]*\)%.*/\1/p')
  b1=$(echo "$out" | grep "^  rank 1:" | sed -n 's/.*bubble \([0-9.]*\)%.*/\1/p')
  [ -n "$b0" ] && [ -n "$b1" ] || fail "no bubbles in the rank lines"
  echo "$out" | grep -q "predicted peak" || fail "no predicted peak"
  echo "$out" | grep -qE "^    rank 0 \|[0-9a-z.+*]+\|$" || fail "no schedule diagram"
}

# 1. The example as generated: balanced by estimated work.
check "$program"
[ "$s0" -ge 35 ] && [ "$s0" -le 65 ] || fail "the generated placement gives stage 0 $s0% of the work"
awk -v a="$b0" -v b="$b1" 'BEGIN { exit !(a < 50 && b < 50) }' || fail "a balanced pipeline idles: bubbles $b0% and $b1%"

# 2. conv4 moved onto stage 0: the convolutions make it the heavy stage.
sed -E '/output: \["conv4\./ s/device: "gpu:1"/device: "gpu:0"/' "$program" >"$tmp/unbalanced.pbtxt"
grep -q 'output: \["conv4.xw"\].*gpu:0' "$tmp/unbalanced.pbtxt" || fail "could not move conv4 to stage 0"
check "$tmp/unbalanced.pbtxt"
[ "$s0" -gt 70 ] || fail "with conv4 on stage 0, stage 0 has only $s0% of the work"
awk -v a="$b0" -v b="$b1" 'BEGIN { exit !(b > 50 && a < b) }' || fail "expected the light rank 1 to idle most: bubbles $b0% and $b1%"
echo "$out" | grep -q "dp group" && fail "a layout without data parallelism prints dp lines"
echo "$out" | grep -q "with recompute" && fail "a layout without recompute prints a recompute line"

# 3. Data parallelism: each rank's lines under "rank N:" come from its plan.
# An MLP 8 -> 16 -> 4 in F32: fc2.b 16 B and fc2.w 256 B finish first and
# share a bucket of 314 B (bucket_mb 0.0003); fc1.b (64 B) would pass the
# cap, and fc1.w (512 B) is larger than it, so each gets one of its own.
dp_check() {  # PROGRAM STRATEGY_TEXT BATCH: sets $out
  printf '%s\n' "$2" >"$tmp/dp.strategy.pbtxt"
  out=$("$strata" check "$1" --strategy "$tmp/dp.strategy.pbtxt" --batch_size "$3" 2>&1) || fail "check failed: $out"
  echo "$out"
}
expect_after_rank() {  # RANKS EXPECTED_LINES: as many lines right below "  rank RANKS:" or "  ranks RANKS (...):"
  got=$(echo "$out" | grep -A"$(printf '%s\n' "$2" | wc -l)" -E "^  (rank $1:|ranks $1 \()" | tail -n +2)
  [ "$got" = "$2" ] || fail "rank(s) $1's lines: expected
$2
got
$got"
}
"$strata" gen mlp --layers 8,16,4 >"$tmp/mlp.pbtxt" || fail "gen mlp"
dp_check "$tmp/mlp.pbtxt" 'data_parallel { degree: 2 bucket_mb: 0.0003 }' 8
# The replicas' lines read the same: printed once, under both ranks.
echo "$out" | grep -q "^  ranks 0, 1 (2 data-parallel replicas): predicted peak" || fail "the replicas are not one entry: $out"
echo "$out" | grep -qE "^  rank [01]:" && fail "a replica has an entry of its own: $out"
expect_after_rank "0, 1" "    dp group 1: ranks 0, 1
    3 buckets, in the order posted: 2 gradients (272 B), 1 gradient (64 B), 1 gradient (512 B)
    gradient allreduce: sends 848 B per optimizer step (the ring algorithm's 2*(D-1)/D of the buckets' 848 B, D = 2 ranks)"
# Four ranks: each sends 2*3/4 of the 848 B.
dp_check "$tmp/mlp.pbtxt" 'data_parallel { degree: 4 bucket_mb: 0.0003 }' 8
expect_after_rank "0, 1, 2, 3" "    dp group 1: ranks 0, 1, 2, 3
    3 buckets, in the order posted: 2 gradients (272 B), 1 gradient (64 B), 1 gradient (512 B)
    gradient allreduce: sends 1.2 KiB per optimizer step (the ring algorithm's 2*(D-1)/D of the buckets' 848 B, D = 4 ranks)"
# Many buckets are summarised (one gradient each at a cap of one byte).
"$strata" gen resmlp --layers 24,32,10 --blocks 4 >"$tmp/resmlp.pbtxt" || fail "gen resmlp"
dp_check "$tmp/resmlp.pbtxt" 'data_parallel { degree: 2 bucket_mb: 0.000001 }' 8
expect_after_rank "0, 1" "    dp group 1: ranks 0, 1
    28 buckets of 1 gradient, 40 B-4.0 KiB; 28 gradients (38.4 KiB) in all
    gradient allreduce: sends 38.4 KiB per optimizer step (the ring algorithm's 2*(D-1)/D of the buckets' 38.4 KiB, D = 2 ranks)"

# 4. pp2 x dp2: ranks 0 and 2 hold stage 0 (fc1, 576 B), 1 and 3 stage 1
# (fc2, 272 B); each stage's replicas form a dp group, one bucket each.
"$strata" gen mlp --layers 8,16,4 --stages 2 >"$tmp/mlp_pp2.pbtxt" || fail "gen mlp --stages 2"
dp_check "$tmp/mlp_pp2.pbtxt" 'pipeline { micro_batch_size: 2 accumulate_steps: 4 } data_parallel { degree: 2 }' 16
echo "$out" | grep -q "^  ranks 0, 2 (stage 0's 2 data-parallel replicas): predicted peak" || fail "no entry for stage 0's replicas: $out"
expect_after_rank "0, 2" "    dp group 1: ranks 0, 2
    1 bucket: 2 gradients (576 B)
    gradient allreduce: sends 576 B per optimizer step (the ring algorithm's 2*(D-1)/D of the buckets' 576 B, D = 2 ranks)"
expect_after_rank "1, 3" "    dp group 2: ranks 1, 3
    1 bucket: 2 gradients (272 B)
    gradient allreduce: sends 272 B per optimizer step (the ring algorithm's 2*(D-1)/D of the buckets' 272 B, D = 2 ranks)"
# The schedule: a row a stage, its replicas' rows being the same.
echo "$out" | grep -qE "^    stage 0 \|[0-9a-z.]+\|$" && echo "$out" | grep -qE "^    stage 1 \|[0-9a-z.]+\|$" ||
  fail "the schedule is not a row a stage: $out"
echo "$out" | grep -qE "^    rank [0-9] \|" && fail "the schedule still has a row a rank: $out"

# 5. Recompute: under each rank's line, its activation peak with recompute
# and without (the same program compiled with the recompute section cleared).
# A residual MLP of 8 blocks of 24-32, batch 256 in F32: checkpoints every 2
# blocks keep 419.3 KiB of the 1.10 MiB (the loss's segment stays whole).
"$strata" gen resmlp --layers 24,32,10 --blocks 8 >"$tmp/resmlp8.pbtxt" || fail "gen resmlp --blocks 8"
dp_check "$tmp/resmlp8.pbtxt" 'recompute { checkpoints: ["h2", "h4", "h6"] }' 256
expect_after_rank 0 "    activations 419.3 KiB with recompute, 1.10 MiB without (37%)"
echo "$out" | grep -q "^  rank 0: .*activations 419.3 KiB)" || fail "the rank line's activations are not recompute's"
without=$("$strata" check "$tmp/resmlp8.pbtxt" --batch_size 256 2>&1) || fail "check without recompute: $without"
echo "$without" | grep -q "^  rank 0: .*activations 1.10 MiB)" || fail "without recompute, rank 0's activations are not 1.10 MiB: $without"
echo "$without" | grep -q "with recompute" && fail "check without recompute prints a recompute line"
# Two stages of 4 blocks, 4 micro-batches of 64: each rank its own figures;
# the stage cut is a checkpoint too, and stage 1 keeps its loss's segment.
"$strata" gen resmlp --layers 24,32,10 --blocks 8 --stages 2 >"$tmp/resmlp8_pp2.pbtxt" || fail "gen resmlp --stages 2"
dp_check "$tmp/resmlp8_pp2.pbtxt" 'pipeline { micro_batch_size: 64 accumulate_steps: 4 } recompute { checkpoints: ["h2", "h6"] }' 256
expect_after_rank 0 "    activations 108.0 KiB with recompute, 292.0 KiB without (37%)"
expect_after_rank 1 "    activations 96.5 KiB with recompute, 152.5 KiB without (63%)"
# With data parallelism the recompute line comes first, then the dp lines.
dp_check "$tmp/resmlp8.pbtxt" 'data_parallel { degree: 2 } recompute { checkpoints: ["h2", "h4", "h6"] }' 256
got=$(echo "$out" | grep -A2 "^  ranks 0, 1 (" | tail -n +2)
# (No `head` in a pipe: under pipefail, echo killed by SIGPIPE when head
# exits early failed this check now and then.)
grep -qE "^    activations [0-9.]+ KiB with recompute, [0-9.]+ [KM]iB without \([0-9]+%\)$" <<<"$(sed -n 1p <<<"$got")" ||
  fail "the replicas' recompute line under dp: $got"
echo "$got" | tail -1 | grep -q "^    dp group 1: ranks 0, 1$" || fail "the replicas' dp group line after the recompute line: $got"

# 6. Memory against the device. On the CPU the ranks share the machine, so
# their peaks add up; on GPUs each rank has its own, held against the GPU
# strata_gpu opens or --device_memory_gib. A peak that does not fit is a
# warning on stderr (check still succeeds), naming each rank above it.
mem=$("$strata" check "$tmp/resmlp8_pp2.pbtxt" --strategy "$tmp/dp.strategy.pbtxt" --batch_size 256 2>&1) || fail "check: $mem"
echo "$mem" | grep -qE "^  device memory: this machine holds [0-9.]+ GiB; the 2 ranks' predicted peaks add up to" ||
  fail "no CPU memory line: $mem"
printf '%s\n' 'pipeline { micro_batch_size: 64 accumulate_steps: 4 }' >"$tmp/pp2.strategy.pbtxt"
peaks() { echo "$1" | sed -n 's/^  rank \([0-9]\): predicted peak \([0-9.]* [KMG]*i*B\).*/rank \1 \2/p'; }
out=$("$strata" check "$tmp/resmlp8_pp2.pbtxt" --strategy "$tmp/pp2.strategy.pbtxt" --batch_size 256 --device gpu \
  --device_memory_gib 0.0001 2>"$tmp/err") || fail "check --device gpu: $out"
want="warning: predicted peak above the 104.9 KiB each GPU (--device_memory_gib 0.0001) holds: $(peaks "$out" | paste -sd, | sed 's/,/, /g'); the run would run out of memory"
[ "$(cat "$tmp/err")" = "$want" ] || fail "expected on stderr
$want
got
$(cat "$tmp/err")"
# With replicas, a stage's ranks of one peak are one entry.
printf '%s\n' 'pipeline { micro_batch_size: 64 accumulate_steps: 4 } data_parallel { degree: 2 }' >"$tmp/pp2dp2.strategy.pbtxt"
out=$("$strata" check "$tmp/resmlp8_pp2.pbtxt" --strategy "$tmp/pp2dp2.strategy.pbtxt" --batch_size 512 --device gpu \
  --device_memory_gib 0.0001 2>"$tmp/err") || fail "check --device gpu under dp: $out"
peak0=$(echo "$out" | sed -n 's/^  ranks 0, 2 ([^)]*): predicted peak \([0-9.]* [KMG]*i*B\).*/\1/p')
peak1=$(echo "$out" | sed -n 's/^  ranks 1, 3 ([^)]*): predicted peak \([0-9.]* [KMG]*i*B\).*/\1/p')
want="warning: predicted peak above the 104.9 KiB each GPU (--device_memory_gib 0.0001) holds: ranks 0, 2 $peak0, ranks 1, 3 $peak1; the run would run out of memory"
[ -n "$peak0" ] && [ "$(cat "$tmp/err")" = "$want" ] || fail "expected on stderr
$want
got
$(cat "$tmp/err")"
out=$("$strata" check "$tmp/resmlp8_pp2.pbtxt" --strategy "$tmp/pp2.strategy.pbtxt" --batch_size 256 --device gpu \
  --device_memory_gib 80 2>"$tmp/err") || fail "check --device gpu: $out"
[ -s "$tmp/err" ] && fail "a plan that fits 80 GiB warns: $(cat "$tmp/err")"
echo "$out" | grep -qE "^  device memory: each GPU \(--device_memory_gib 80\) holds 80.00 GiB; rank [01]'s predicted peak, the largest, is" ||
  fail "no GPU memory line: $out"
# 7. A tied weight (GPT's token embedding on stage 0, tied to the LM head on
# stage 1) exchanges its gradient once an update, with gradient merge too:
# each stage line counts those transfers and the bytes it sends there (the
# [256, 64] F32 gradient, 64.0 KiB each way).
"$strata" gen gpt --blocks 2 --d_model 64 --heads 4 --seq 32 --vocab 256 --stages 2 >"$tmp/gpt_pp2.pbtxt" ||
  fail "gen gpt"
printf '%s\n' 'pipeline { micro_batch_size: 2 accumulate_steps: 4 }' 'gradient_merge { k_steps: 2 }' >"$tmp/gm.strategy.pbtxt"
for device in cpu gpu; do
  out=$("$strata" check "$tmp/gpt_pp2.pbtxt" --strategy "$tmp/gm.strategy.pbtxt" --device $device 2>&1) ||
    fail "check of a tied GPT under gradient merge (--device $device): $out"
  for stage in 0 1; do
    echo "$out" | grep -qE "^  stage $stage: .*, 4 transfers \(2 once an update, sending 64.0 KiB\)," ||
      fail "stage $stage's line does not count the tied exchange (--device $device): $out"
  done
done
"$strata" check "$tmp/resmlp8_pp2.pbtxt" --device_memory_gib -3 2>"$tmp/err" && fail "a negative --device_memory_gib passed"
grep -q "^error: --device_memory_gib -3: expected a size in GiB" "$tmp/err" || fail "negative size: $(cat "$tmp/err")"
echo "PASS"
