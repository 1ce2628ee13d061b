#!/usr/bin/env bash
# Ranks started by hand (torchrun-style) must agree on every setting that
# changes what is trained: different --steps, --seed or --data are refused
# on both ranks before the first step, naming the difference (before, they
# hung until the comm timeout or trained the wrong model with exit 0); a
# program that differs only in a comment compiles to the same plans and runs;
# a --nproc that disagrees with torchrun's or srun's world is refused.
set -uo pipefail
strata=$1
program=$2
strategy=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }

n=0
two_ranks() {  # "rank 0 args" "rank 1 args": runs both, sets rc0 rc1, errors in $tmp/r{0,1}.txt
  n=$((n + 1))
  local store="$tmp/store$n"; mkdir -p "$store"
  # shellcheck disable=SC2086
  STRATA_RANK=0 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" timeout 60 "$strata" run --strategy "$strategy" \
    --quiet --comm_timeout_s 50 $1 >/dev/null 2>"$tmp/r0.txt" &
  local r0=$!
  # shellcheck disable=SC2086
  STRATA_RANK=1 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" timeout 60 "$strata" run --strategy "$strategy" \
    --quiet --comm_timeout_s 50 $2 >/dev/null 2>"$tmp/r1.txt"
  rc1=$?
  wait $r0
  rc0=$?
}

refused() {  # what "rank 0 args" "rank 1 args" expected-substring
  local start=$(date +%s)
  two_ranks "$2" "$3"
  local took=$(( $(date +%s) - start ))
  [ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] || fail "$1: exits $rc0 and $rc1, both should refuse"
  [ $rc0 -ne 124 ] && [ $rc1 -ne 124 ] && [ $took -lt 30 ] || fail "$1: a rank hung (${took}s)"
  for r in 0 1; do
    grep -q "$4" "$tmp/r$r.txt" || fail "$1: rank $r said: $(cat "$tmp/r$r.txt")"
  done
  echo "ok: $1 refused in ${took}s: $(grep -m1 '^error' "$tmp/r1.txt")"
}

base="$program --data synthetic"
refused "different --steps" "$base --steps 5" "$base --steps 6" "rank 1 has --steps 6 but rank 0 has --steps 5"
refused "different --seed" "$base --steps 5 --seed 1" "$base --steps 5 --seed 2" "rank 1 has --seed 2 but rank 0 has --seed 1"
refused "different --data" "$base --steps 5" "$program --data synthetic:size=4096 --steps 5" \
  "rank 1 has --data synthetic train 4096 samples"
refused "--save on one rank only" "$base --steps 5 --save $tmp/ck_one" "$base --steps 5" \
  "rank 1 has --save (none) but rank 0 has --save (a folder)"
# Folders of their own (as on machines without a shared filesystem): found
# before the first step, not at the first save after training.
refused "--save folders not shared" "$base --steps 5 --save $tmp/save_a" "$base --steps 5 --save $tmp/save_b" \
  "rank 0 does not see the files rank(s) 1 wrote there: --save must be a folder every rank shares"
refused "different --eval_data" "$base --steps 5 --eval_data synthetic:test,size=64" "$base --steps 5" \
  "rank 1 has --eval_data (none) but rank 0 has --eval_data synthetic test 64 samples"

# Two runs' checkpoints of the same step: each rank would resume its own
# run's weights (a mixed model, exit 0). A copy of one folder is the same save.
for ck in ck_a ck_b; do
  timeout 60 "$strata" run $base --strategy "$strategy" --steps 6 --save_every 4 --nproc 2 --quiet --save "$tmp/$ck" \
    >/dev/null 2>"$tmp/save.txt" || fail "saving $ck: $(cat "$tmp/save.txt")"
done
refused "two runs' checkpoints of one step" "$base --steps 6 --load $tmp/ck_a/step-4" "$base --steps 6 --load $tmp/ck_b/step-4" \
  "rank 1 has the loaded checkpoint step 4 (save [0-9a-f]*) but rank 0 has the loaded checkpoint step 4 (save [0-9a-f]*)"
cp -r "$tmp/ck_a" "$tmp/ck_a_copy"
two_ranks "$base --steps 6 --load $tmp/ck_a/step-4" "$base --steps 6 --load $tmp/ck_a_copy/step-4"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "a copy of the checkpoint was refused: $(cat "$tmp/r0.txt" "$tmp/r1.txt")"
echo "ok: a copy of the checkpoint folder is the same save"

# A rank that stops before meeting the others (its --save cannot be
# written) tells them through the store: rank 0 ends within seconds naming
# it, not at --comm_timeout_s (50 s here).
start=$(date +%s)
two_ranks "$base --steps 5" "$base --steps 5 --save /proc/strata_ckpt"
took=$(( $(date +%s) - start ))
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && [ $took -lt 15 ] || fail "a rank that stopped early: exits $rc0 and $rc1 in ${took}s"
grep -q "rank 1 gave up: it stopped before meeting the others" "$tmp/r0.txt" || fail "rank 0 said: $(cat "$tmp/r0.txt")"
grep -q "^error: --save /proc/strata_ckpt" "$tmp/r1.txt" || fail "rank 1 said: $(cat "$tmp/r1.txt")"
echo "ok: a rank that stops before the rendezvous ends the others' wait in ${took}s: $(cat "$tmp/r0.txt")"

# A start every rank fails (no rank met the others) leaves nothing in the
# store: the corrected rerun in the same store runs, its ranks 3 s apart.
store="$tmp/store_rerun"; mkdir -p "$store"
for r in 0 1; do
  # shellcheck disable=SC2086
  STRATA_RANK=$r STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" timeout 60 "$strata" run --strategy "$strategy" \
    --quiet $base --steps 2 --save /proc/strata_ckpt >/dev/null 2>&1 &
done
wait
# shellcheck disable=SC2086
STRATA_RANK=0 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" timeout 60 "$strata" run --strategy "$strategy" \
  --quiet --comm_timeout_s 50 $base --steps 2 >/dev/null 2>"$tmp/r0.txt" &
r0=$!
sleep 3
# shellcheck disable=SC2086
STRATA_RANK=1 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" timeout 60 "$strata" run --strategy "$strategy" \
  --quiet --comm_timeout_s 50 $base --steps 2 >/dev/null 2>"$tmp/r1.txt"
rc1=$?
wait $r0
rc0=$?
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "the rerun after a failed start: exits $rc0 and $rc1: $(cat "$tmp/r0.txt" "$tmp/r1.txt")"
echo "ok: a start every rank failed leaves the store clean for the rerun"

# The same data at different paths (as on two machines) is the same data.
mkdir -p "$tmp/copy_a" "$tmp/copy_b"
for f in /usr/share/datasets/fashion-mnist/t10k-*; do cp "$f" "$tmp/copy_a/"; cp "$f" "$tmp/copy_b/"; done
two_ranks "$program --data fashion_mnist:test,path=$tmp/copy_a --steps 2" "$program --data fashion_mnist:test,path=$tmp/copy_b --steps 2"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "the same data at two paths was refused: $(cat "$tmp/r0.txt" "$tmp/r1.txt")"
echo "ok: the same data at two paths trains"

# Only a comment apart: the same compiled plans, so the job runs.
{ echo "# a comment that moves every line down"; echo; cat "$program"; } > "$tmp/commented.pbtxt"
two_ranks "$base --steps 3" "$tmp/commented.pbtxt --data synthetic --steps 3"
[ $rc0 -eq 0 ] && [ $rc1 -eq 0 ] || fail "a program differing in a comment was refused: $(cat "$tmp/r0.txt" "$tmp/r1.txt")"
echo "ok: a program that differs only in a comment runs with the original"
# Under torchrun or srun the outer launcher starts the ranks: a --nproc that
# disagrees is one error line before any rendezvous (it was ignored).
for env in "RANK=1 WORLD_SIZE=2" "SLURM_PROCID=1 SLURM_NTASKS=2"; do
  # shellcheck disable=SC2086
  env $env timeout 30 "$strata" run $base --strategy "$strategy" --steps 1 --nproc 4 >/dev/null 2>"$tmp/nproc.txt"
  rc=$?
  [ $rc -eq 2 ] || fail "$env with --nproc 4: exit $rc: $(cat "$tmp/nproc.txt")"
  grep -q "^error: rank 1: --nproc 4, but an outside launcher (torchrun or srun) started this process as one of 2 ranks" \
    "$tmp/nproc.txt" || fail "$env with --nproc 4 said: $(cat "$tmp/nproc.txt")"
done
echo "ok: a --nproc that disagrees with torchrun's or srun's world is refused: $(cat "$tmp/nproc.txt")"
echo "PASS"
