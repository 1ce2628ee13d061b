#!/usr/bin/env bash
# Checkpoints survive failures: a rank that dies part-way through its write,
# or before the ranks agree, or whose write hits a file-size limit, leaves
# DIR/latest on the previous complete step, which resumes the uninterrupted
# loss series exactly; old step folders beyond --keep_checkpoints go; SIGTERM
# (a preemption) stops every rank after the same step, saves, writes the
# trace and exits 143, and ranks still in a step at the end of the grace are
# killed and named.
set -uo pipefail
strata=$1
strategy=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }
# A cosine over a fixed 100 steps: a run-length cosine would decay over
# whatever --steps each invocation has, and runs of other lengths would differ.
program="$tmp/mlp_pp2.pbtxt"
sed 's/cosine {}/cosine { decay_steps: 100 }/' "$2" > "$program"
grep -q "decay_steps: 100" "$program" || fail "could not fix the cosine's length in $2"
run_pp2() { "$strata" run "$program" --strategy "$strategy" --nproc 2 --data synthetic --quiet "$@"; }
# The losses of a metrics file, one per line ("step loss").
losses() { sed -n 's/^{"step": \([0-9]*\), "epoch": [0-9]*, "loss": \([^,]*\),.*/\1 \2/p' "$1"; }
# The resumed series must equal the uninterrupted one from its first step on.
same_tail() {  # reference.jsonl resumed.jsonl first_resumed_step
  diff <(losses "$1" | awk -v s="$3" '$1 >= s') <(losses "$2") >/dev/null ||
    fail "resumed losses differ from the uninterrupted run: $(diff <(losses "$1" | awk -v s="$3" '$1 >= s') <(losses "$2") | head -4)"
}

run_pp2 --steps 8 --metrics "$tmp/ref.jsonl" >/dev/null 2>&1 || fail "reference run failed"
[ "$(losses "$tmp/ref.jsonl" | wc -l)" -eq 8 ] || fail "reference run has no 8 losses"

# 1-2. A rank dies half-way through its file, or with its file durable but
#      before the agreement: step-4 is never committed, latest stays step-2.
for fault in checkpoint_partial_write:rank=1:step=4 checkpoint_before_agree:rank=0:step=4; do
  ck="$tmp/ck_${fault%%:*}"
  STRATA_FAULT=$fault run_pp2 --steps 8 --save "$ck" --save_every 2 --log_dir "$tmp/log" >/dev/null 2>"$tmp/err.txt"
  rc=$?
  [ $rc -ne 0 ] || fail "$fault: the job exited 0"
  grep -q "fault injected at ${fault%%:*}" "$tmp/err.txt" || fail "$fault: no injected fault: $(cat "$tmp/err.txt")"
  # The rank that died (recording nothing) is named, not the peer it left waiting.
  faulty=$(echo "$fault" | sed -n 's/.*:rank=\([0-9]*\).*/\1/p')
  grep -q "^error: rank $faulty failed (exit 86)" "$tmp/err.txt" || fail "$fault: named $(grep '^error' "$tmp/err.txt")"
  [ "$(cat "$ck/latest")" = "step-2" ] || fail "$fault: latest is '$(cat "$ck/latest")', expected step-2"
  [ -e "$ck/step-4/COMMITTED" ] && fail "$fault: step-4 is committed"
  "$strata" run "$program" --strategy "$strategy" --nproc 2 --data synthetic --quiet --steps 8 --load "$ck/step-4" \
    >/dev/null 2>"$tmp/err.txt" && fail "$fault: --load of the uncommitted step-4 succeeded"
  grep -q "not committed" "$tmp/err.txt" || fail "$fault: loading step-4: $(cat "$tmp/err.txt")"
  # Resume from latest (step 2) into the same folder, saving every 2 steps.
  rm -f "$tmp/resumed.jsonl"  # a resumed run appends to its metrics file
  run_pp2 --steps 8 --load "$ck" --save "$ck" --save_every 2 --metrics "$tmp/resumed.jsonl" >/dev/null 2>"$tmp/err.txt" ||
    fail "$fault: resume failed: $(cat "$tmp/err.txt")"
  grep -q "resuming from $ck/step-2 (latest) at step 2" "$tmp/err.txt" || fail "$fault: resume note: $(cat "$tmp/err.txt")"
  same_tail "$tmp/ref.jsonl" "$tmp/resumed.jsonl" 3
  # --keep_checkpoints 2: steps 6 and 8 remain, committed.
  [ "$(cd "$ck" && ls -d step-* | tr '\n' ' ')" = "step-6 step-8 " ] || fail "$fault: kept $(ls "$ck")"
  [ -e "$ck/step-8/COMMITTED" ] && [ "$(cat "$ck/latest")" = "step-8" ] || fail "$fault: step-8 not latest"
  echo "ok: $fault leaves latest at step-2, which resumes the series; kept $(ls -d "$ck"/step-* | xargs -n1 basename | tr '\n' ' ')"
done

# 3. A file-size limit on one rank (ranks started by hand, torchrun-style):
#    rank 0's write fails with EFBIG, the save fails on both, latest stays.
ck="$tmp/ck_ulimit"
run_pp2 --steps 2 --save "$ck" >/dev/null 2>&1 || fail "ulimit: first save failed"
store="$tmp/store"; mkdir -p "$store"
(ulimit -f 64; STRATA_RANK=0 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" exec timeout 120 "$strata" run "$program" \
  --strategy "$strategy" --data synthetic --quiet --steps 4 --load "$ck" --save "$ck") 2>"$tmp/r0.txt" &
r0=$!
STRATA_RANK=1 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" timeout 120 "$strata" run "$program" \
  --strategy "$strategy" --data synthetic --quiet --steps 4 --load "$ck" --save "$ck" 2>"$tmp/r1.txt"
rc1=$?
wait $r0
rc0=$?
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] || fail "ulimit: exits $rc0 and $rc1; both ranks should fail the save"
[ $rc0 -ne 124 ] && [ $rc1 -ne 124 ] || fail "ulimit: a rank hung"
grep -q "^error: rank 0: .*File too large" "$tmp/r0.txt" || fail "ulimit: rank 0 said: $(cat "$tmp/r0.txt")"
grep -q "^error: rank 1: .*not saved" "$tmp/r1.txt" || fail "ulimit: rank 1 said: $(cat "$tmp/r1.txt")"
[ "$(cat "$ck/latest")" = "step-2" ] || fail "ulimit: latest is $(cat "$ck/latest")"
rm -f "$tmp/resumed.jsonl"
run_pp2 --steps 8 --load "$ck" --metrics "$tmp/resumed.jsonl" >/dev/null 2>&1 || fail "ulimit: resume failed"
same_tail "$tmp/ref.jsonl" "$tmp/resumed.jsonl" 3
echo "ok: a file-size limit on rank 0 fails the save on both ranks ($(grep -o 'File too large' "$tmp/r0.txt")); latest stays step-2"

# 4. SIGTERM, on one device and to the launcher of a pipeline: every rank
#    stops after the same step, saves it, and the job exits 143; resuming
#    continues the series of an uninterrupted run.
for nproc in 1 2; do
  ck="$tmp/ck_term$nproc"
  if [ $nproc -eq 1 ]; then cmd=("$strata" run "$program" --data synthetic --quiet)
  else cmd=("$strata" run "$program" --strategy "$strategy" --nproc 2 --data synthetic --quiet); fi
  rm -f "$tmp/term.jsonl" "$tmp/ref_term.jsonl" "$tmp/resumed_term.jsonl"
  rm -f "$tmp/term_trace.json"
  "${cmd[@]}" --steps 1000000 --save "$ck" --metrics "$tmp/term.jsonl" --trace "$tmp/term_trace.json" \
    --eval_data synthetic:test,size=16 --eval_every 2 >"$tmp/out.txt" 2>"$tmp/err.txt" &
  pid=$!
  for _ in $(seq 300); do [ "$(losses "$tmp/term.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
  kill -TERM $pid
  wait $pid
  rc=$?
  [ $rc -eq 143 ] || fail "SIGTERM (nproc $nproc): exit $rc, expected 143: $(cat "$tmp/err.txt")"
  step=$(sed -n 's/.*stopped by SIGTERM after step \([0-9]*\); saved .*/\1/p' "$tmp/err.txt" | head -1)
  [ -n "$step" ] || fail "SIGTERM (nproc $nproc): no 'stopped ... saved' line: $(cat "$tmp/err.txt")"
  [ "$(cat "$ck/latest")" = "step-$step" ] || fail "SIGTERM (nproc $nproc): latest $(cat "$ck/latest"), stopped at $step"
  [ "$(ls "$ck/step-$step" | grep -c safetensors)" -eq $nproc ] || fail "SIGTERM (nproc $nproc): files $(ls "$ck/step-$step")"
  [ "$(losses "$tmp/term.jsonl" | tail -1 | cut -d' ' -f1)" = "$step" ] || fail "SIGTERM: metrics go past step $step"
  # The last evaluation (every 2 steps) is the final one only if it followed
  # the step the run stopped after.
  if [ $((step % 2)) -eq 0 ]; then final="final test loss"; else final="final train loss"; fi
  grep -q "^\(\[rank [0-9]*\] \)\?$final" "$tmp/out.txt" ||
    fail "SIGTERM (nproc $nproc) after step $step: expected '$final': $(cat "$tmp/out.txt")"
  # The trace of a stopped job is written, each rank's part merged (a
  # launcher left the parts unmerged).
  grep -q '"traceEvents"' "$tmp/term_trace.json" || fail "SIGTERM (nproc $nproc): no --trace written"
  [ -z "$(ls "$tmp"/term_trace.json.rank* 2>/dev/null)" ] || fail "SIGTERM (nproc $nproc): trace parts left unmerged"
  "${cmd[@]}" --steps $((step + 3)) --metrics "$tmp/ref_term.jsonl" >/dev/null 2>&1 || fail "SIGTERM: reference failed"
  "${cmd[@]}" --steps $((step + 3)) --load "$ck" --metrics "$tmp/resumed_term.jsonl" >/dev/null 2>&1 ||
    fail "SIGTERM: resume failed"
  same_tail "$tmp/ref_term.jsonl" "$tmp/resumed_term.jsonl" $((step + 1))
  diff <(losses "$tmp/ref_term.jsonl" | head -$step) <(losses "$tmp/term.jsonl") >/dev/null ||
    fail "SIGTERM: the stopped run's losses differ from the reference"
  echo "ok: SIGTERM with nproc $nproc stopped after step $step, saved it, exit 143; the resume continues the series"
done
# 4b. A rank still in a step when the preemption grace ends is killed, and
#     the job says so, naming it and the checkpoint it could not write (it
#     ended with exit 143 and no word). STRATA_PREEMPTION_GRACE_S sets the
#     grace (2 s here; rank 1 sleeps 60 s in step 4, and rank 0 waits for it
#     to agree on the stop, so both are killed).
rm -f "$tmp/grace.jsonl"
STRATA_PREEMPTION_GRACE_S=2 STRATA_FAULT=slow_step:rank=1:step=4:seconds=60 "$strata" run "$program" \
  --strategy "$strategy" --nproc 2 --data synthetic --quiet --steps 1000000 --save "$tmp/ck_grace" \
  --metrics "$tmp/grace.jsonl" >/dev/null 2>"$tmp/err.txt" &
pid=$!
for _ in $(seq 300); do [ "$(losses "$tmp/grace.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
sleep 0.5
start=$(date +%s)
kill -TERM $pid
wait $pid
rc=$?
took=$(( $(date +%s) - start ))
[ $rc -eq 143 ] || fail "grace: exit $rc, expected 143: $(cat "$tmp/err.txt")"
[ $took -lt 20 ] || fail "grace: the job took ${took}s to end after SIGTERM with a 2 s grace"
[ "$(grep -c '^error:' "$tmp/err.txt")" -eq 1 ] || fail "grace: not one error line: $(cat "$tmp/err.txt")"
grep -q "^error: ranks 0, 1 were killed: not stopped 2s after SIGTERM, so no checkpoint of the stop is in $tmp/ck_grace" \
  "$tmp/err.txt" || fail "grace: $(grep '^error' "$tmp/err.txt")"
echo "ok: a rank still in its step at the end of the grace is named in ${took}s: $(grep '^error' "$tmp/err.txt")"
STRATA_PREEMPTION_GRACE_S=abc "$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 1 --quiet \
  >/dev/null 2>"$tmp/err.txt"
rc=$?
[ $rc -eq 2 ] && grep -q "^error: STRATA_PREEMPTION_GRACE_S='abc': expected seconds in (0, 86400]" "$tmp/err.txt" ||
  fail "a bad STRATA_PREEMPTION_GRACE_S: exit $rc: $(cat "$tmp/err.txt")"

# 5. SIGTERM to one worker only (one machine of the job preempted): every
#    rank stops after the same step and saves it, and the job exits 143.
ck="$tmp/ck_term_one"
rm -f "$tmp/term.jsonl" "$tmp/one_trace.json"
"$strata" run "$program" --strategy "$strategy" --nproc 2 --data synthetic --quiet --steps 1000000 --save "$ck" \
  --metrics "$tmp/term.jsonl" --trace "$tmp/one_trace.json" >/dev/null 2>"$tmp/err.txt" &
pid=$!
for _ in $(seq 300); do [ "$(losses "$tmp/term.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
kill -TERM "$(pgrep -P $pid | head -1)"
wait $pid
rc=$?
[ $rc -eq 143 ] || fail "SIGTERM to one worker: exit $rc: $(grep -E 'error|stopped' "$tmp/err.txt")"
[ "$(grep -c 'stopped by SIGTERM' "$tmp/err.txt")" -eq 2 ] || fail "SIGTERM to one worker: $(cat "$tmp/err.txt")"
grep -q "(on another rank)" "$tmp/err.txt" || fail "SIGTERM to one worker: the other rank does not say why it stopped"
grep -q '"traceEvents"' "$tmp/one_trace.json" && [ -z "$(ls "$tmp"/one_trace.json.rank* 2>/dev/null)" ] ||
  fail "SIGTERM to one worker: the trace was not merged"
step=$(sed -n 's/.*stopped by SIGTERM.* after step \([0-9]*\);.*/\1/p' "$tmp/err.txt" | sort -u)
[ "$(echo "$step" | wc -l)" -eq 1 ] && [ "$(cat "$ck/latest")" = "step-$step" ] ||
  fail "SIGTERM to one worker: ranks stopped after steps $step, latest $(cat "$ck/latest")"
echo "ok: SIGTERM to one worker stopped both ranks after step $step, saved it, exit 143"

# 6. A preemption whose save fails is a failure, not exit 143.
rm -f "$tmp/term.jsonl"
STRATA_FAULT=checkpoint_partial_write:rank=1 "$strata" run "$program" --strategy "$strategy" --nproc 2 \
  --data synthetic --quiet --steps 1000000 --save "$tmp/ck_term_fail" --metrics "$tmp/term.jsonl" >/dev/null 2>"$tmp/err.txt" &
pid=$!
for _ in $(seq 300); do [ "$(losses "$tmp/term.jsonl" 2>/dev/null | wc -l)" -ge 3 ] && break; sleep 0.1; done
kill -TERM $pid
wait $pid
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 143 ] || fail "a preemption whose save failed exited $rc"
grep -q "^error: rank 1 failed (exit 86)" "$tmp/err.txt" || fail "failed preemption save: $(grep '^error' "$tmp/err.txt")"
echo "ok: a preemption whose save fails exits $rc naming rank 1"

# 7. --load DIR --save DIR starts afresh only when DIR holds nothing: with
#    committed step folders but no latest it is an error, not step 0.
ck="$tmp/ck_nolatest"
"$strata" run "$program" --data synthetic --quiet --steps 4 --save "$ck" --save_every 2 --keep_checkpoints 0 >/dev/null 2>&1 ||
  fail "no-latest: first run"
rm "$ck/latest"
"$strata" run "$program" --data synthetic --quiet --steps 6 --load "$ck" --save "$ck" >/dev/null 2>"$tmp/err.txt" &&
  fail "a folder with committed steps but no latest restarted at step 0"
grep -q "has committed step folders but no 'latest'; give one as --load $ck/step-" "$tmp/err.txt" ||
  fail "no-latest: $(cat "$tmp/err.txt")"
# A first start with nothing there yet begins at step 0.
"$strata" run "$program" --data synthetic --steps 2 --load "$tmp/ck_fresh" --save "$tmp/ck_fresh" >/dev/null 2>"$tmp/err.txt" ||
  fail "fresh start: $(cat "$tmp/err.txt")"
grep -q "no checkpoint in $tmp/ck_fresh yet; starting at step 0" "$tmp/err.txt" || fail "fresh start: $(cat "$tmp/err.txt")"
# Resuming an older step into the folder would save its latest step again: refused before training.
printf 'step-4\n' > "$ck/latest"  # latest back (steps 2 and 4 are committed)
"$strata" run "$program" --data synthetic --quiet --steps 4 --load "$ck/step-2" --save "$ck" >/dev/null 2>"$tmp/err.txt" &&
  fail "a run due to re-save latest's step trained"
grep -q "its latest checkpoint is step 4, which this run (from step 2) would save again" "$tmp/err.txt" ||
  fail "re-save: $(cat "$tmp/err.txt")"
echo "ok: no latest is an error, an empty folder starts afresh, re-saving latest's step is refused before training"

# A checkpoint of another program (a weight this one has no var for) is
# refused; a parameter this program declares but no op reads, which one
# device saves and a pipeline's plans leave out, is not another program's.
{ cat "$program"; echo 'var { name: "unused" dtype: F32 shape: [4] kind: PARAM }'; } >"$tmp/unused.pbtxt"
rm -rf "$tmp/ck_unused"
"$strata" run "$tmp/unused.pbtxt" --data synthetic --quiet --steps 2 --batch_size 64 --save "$tmp/ck_unused" >/dev/null 2>&1 ||
  fail "one device with an unused parameter"
"$strata" run "$tmp/unused.pbtxt" --strategy "$strategy" --nproc 2 --data synthetic --quiet --steps 4 \
  --load "$tmp/ck_unused" >/dev/null 2>"$tmp/err.txt" || fail "a declared, unread parameter refused: $(cat "$tmp/err.txt")"
"$strata" run "$program" --strategy "$strategy" --nproc 2 --data synthetic --quiet --steps 4 \
  --load "$tmp/ck_unused" >/dev/null 2>"$tmp/err.txt" && fail "a checkpoint with a weight the program lacks was loaded"
grep -q "holds 'unused', which the program has no parameter or state var for" "$tmp/err.txt" ||
  fail "another program's checkpoint: $(cat "$tmp/err.txt")"
# The other way: the pipeline's checkpoint lacks the unread parameter, which
# one device takes at its initial value (what one device's own run holds).
rm -rf "$tmp/ck_unused_pp2"
"$strata" run "$tmp/unused.pbtxt" --strategy "$strategy" --nproc 2 --data synthetic --quiet --steps 2 \
  --save "$tmp/ck_unused_pp2" >/dev/null 2>&1 || fail "pp2 with an unused parameter"
"$strata" run "$tmp/unused.pbtxt" --data synthetic --quiet --steps 4 --batch_size 64 --load "$tmp/ck_unused_pp2" \
  >/dev/null 2>"$tmp/err.txt" || fail "the pipeline's checkpoint on one device: $(cat "$tmp/err.txt")"
echo "ok: another program's checkpoint is refused; a declared parameter no op reads is not another program's"
echo "PASS"
