#!/usr/bin/env bash
# The job names the root cause: when rank 1's loss diverges, the launcher's
# error names rank 1's own error, not rank 0's "connection lost" that it
# caused (the store's counter orders the ranks' reports); a stalled rank
# (SIGSTOP) is named unresponsive within --heartbeat_timeout_s, not after the
# 300 s comm timeout; a slow but live rank is not named; with a tcp:// store,
# a stalled rank 0 (which serves the store) is named by the others, and one
# never started is noted after 10 s.
set -uo pipefail
strata=$1
program=$2
strategy=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source "$(dirname "$0")/job_lib.sh"

# 1. A divergent loss on rank 1 (the loss's stage), eight times over.
sed 's/learning_rate: [0-9.e-]*/learning_rate: 1e30/' "$program" > "$tmp/divergent.pbtxt"
grep -q "learning_rate: 1e30" "$tmp/divergent.pbtxt" || fail "could not raise the learning rate"
for i in $(seq 8); do
  "$strata" run "$tmp/divergent.pbtxt" --strategy "$strategy" --nproc 2 --steps 50 --data synthetic --quiet \
    >/dev/null 2>"$tmp/nan.txt" && fail "a divergent run exited 0"
  line=$(grep '^error:' "$tmp/nan.txt")
  [ "$(grep -c '^error:' "$tmp/nan.txt")" -eq 1 ] || fail "run $i: not one error line: $(cat "$tmp/nan.txt")"
  echo "$line" | grep -q "^error: rank 1 failed (exit 1): rank 1: step [0-9]*: loss is .*training diverged" ||
    fail "run $i named another cause: $line"
done
echo "ok: 8 of 8 divergent runs name rank 1's loss: $line"
grep '^note: then' "$tmp/nan.txt" | head -1

# 2. A stalled rank ends the job within the heartbeat timeout, named.
# Waits until a metrics file has N step lines: the ranks are connected and
# heartbeating (a fixed sleep could stop a rank before it is).
"$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 1000000 --data synthetic --quiet \
  --heartbeat_timeout_s 3 --log_dir "$tmp/log" --metrics "$tmp/stall.jsonl" >/dev/null 2>"$tmp/stall.txt" &
launcher=$!
training "$tmp/stall.jsonl" 3 "$launcher"
victim=$(pgrep -P $launcher | sed -n 2p)
grep -q "STRATA_RANK=1" <(tr '\0' '\n' < "/proc/$victim/environ") || victim=$(pgrep -P $launcher | sed -n 1p)
start=$(date +%s.%N)
kill -STOP "$victim"
wait $launcher
rc=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
kill -KILL "$victim" 2>/dev/null
[ $rc -ne 0 ] || fail "the job exited 0 with a stalled rank"
(( $(echo "$elapsed < 15" | bc) )) || fail "the stalled rank was found after ${elapsed}s (heartbeat timeout 3 s)"
grep -q "^error: rank 0 failed (exit 1): rank 0: rank 1 is unresponsive" "$tmp/stall.txt" ||
  fail "the stall was not named: $(grep error "$tmp/stall.txt")"
echo "ok: a stalled rank 1 was named after ${elapsed}s: $(grep '^error' "$tmp/stall.txt")"

# 3. A slow but live rank (8 s in one step, heartbeat timeout 2 s) is not named.
STRATA_FAULT=slow_step:rank=1:step=3:seconds=8 "$strata" run "$program" --strategy "$strategy" --nproc 2 \
  --steps 5 --data synthetic --quiet --heartbeat_timeout_s 2 >/dev/null 2>"$tmp/slow.txt" ||
  fail "a slow but live rank failed the job: $(cat "$tmp/slow.txt")"
grep -q unresponsive "$tmp/slow.txt" && fail "a slow but live rank was named unresponsive"
echo "ok: a rank 8 s slow in one step with a 2 s heartbeat timeout finishes the job"

# 4. Ranks started by hand with a tcp:// store that rank 0 serves: when rank 0
#    stalls, rank 1 names it (the store stopped answering).
port=$((20000 + RANDOM % 20000))
RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$strata" run "$program" --strategy "$strategy" \
  --steps 1000000 --data synthetic --quiet --heartbeat_timeout_s 3 >/dev/null 2>"$tmp/r0.txt" &
r0=$!
trap 'kill -KILL $r0 2>/dev/null' EXIT  # rank 0 trains a million steps: never left behind by a failure below
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$strata" run "$program" --strategy "$strategy" \
  --steps 1000000 --data synthetic --quiet --heartbeat_timeout_s 3 --metrics "$tmp/r1.jsonl" >/dev/null 2>"$tmp/r1.txt" &
r1=$!
training "$tmp/r1.jsonl" 3 "$r1"
kill -STOP $r0
start=$(date +%s.%N)
wait $r1
rc1=$?
elapsed=$(echo "$(date +%s.%N) - $start" | bc)
kill -KILL $r0 2>/dev/null
[ $rc1 -ne 0 ] && [ $rc1 -ne 124 ] || fail "rank 1 exited $rc1 with rank 0 stalled"
grep -q "^error: rank 1: the store stopped answering .*(rank 0 serves it)" "$tmp/r1.txt" ||
  fail "rank 1 did not name rank 0: $(cat "$tmp/r1.txt")"
echo "ok: rank 0 stalled; rank 1 ended after ${elapsed}s: $(grep '^error' "$tmp/r1.txt")"

# 4a. A MASTER_ADDR that is no address is named as the variable, in one
#     line, before the rank waits for anyone (not as a store spec it never wrote).
RANK=1 WORLD_SIZE=2 MASTER_ADDR='[::1' MASTER_PORT=29999 timeout 60 "$strata" run "$program" --strategy "$strategy" \
  --steps 1 --data synthetic --quiet >/dev/null 2>"$tmp/addr.txt"
rc=$?
[ $rc -eq 2 ] || fail "MASTER_ADDR='[::1': exit $rc, expected 2: $(cat "$tmp/addr.txt")"
[ "$(cat "$tmp/addr.txt")" = "error: rank 1: MASTER_ADDR='[::1' is not a host name or address (an IPv6 address bare, ::1, or in brackets, [::1])" ] ||
  fail "MASTER_ADDR='[::1': $(cat "$tmp/addr.txt")"
echo "ok: a malformed MASTER_ADDR is named in one line"

# 4b. Rank 1 started by hand, rank 0 never: rank 1 says after 10 s that the
#     store (which rank 0 serves) does not answer, and fails at the comm
#     timeout naming it (it was silent until then, 300 s by default).
port=$((20000 + RANDOM % 20000))
start=$(date +%s)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port timeout 60 "$strata" run "$program" --strategy "$strategy" \
  --steps 1 --data synthetic --quiet --comm_timeout_s 12 >/dev/null 2>"$tmp/alone.txt"
rc=$?
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "rank 1 alone exited $rc"
grep -q "^note: no answer from the store at 127.0.0.1:$port for 1[0-9]s (Connection refused); with tcp:// it is served by rank 0" \
  "$tmp/alone.txt" || fail "rank 1 alone said no note: $(cat "$tmp/alone.txt")"
[ "$(grep -c '^error:' "$tmp/alone.txt")" -eq 1 ] || fail "rank 1 alone: not one error line: $(cat "$tmp/alone.txt")"
# Reporting its failure to the store it never reached is one brief try, not
# a second comm timeout (it ended after 24 s).
[ "$(grep -c '^note: no answer' "$tmp/alone.txt")" -eq 1 ] && [ $took -lt 20 ] ||
  fail "rank 1 alone waited twice (${took}s): $(cat "$tmp/alone.txt")"
echo "ok: rank 1 alone noted the silent store and ended in ${took}s: $(grep '^note' "$tmp/alone.txt")"

# 5. A SIGKILLed launcher leaves its store folder; the next run removes it,
#    and never a live job's.
export TMPDIR="$tmp/tmpdir"; mkdir -p "$TMPDIR"
"$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 1000000 --data synthetic --quiet \
  --log_dir "$tmp/log5" --metrics "$tmp/m5.jsonl" >/dev/null 2>&1 &
launcher=$!
training "$tmp/m5.jsonl" 1 "$launcher"
live=$(ls -d "$TMPDIR"/strata_store.* 2>/dev/null)
[ -n "$live" ] || fail "no store folder under $TMPDIR"
kill -KILL $launcher
wait $launcher 2>/dev/null
sleep 0.5  # the workers die with their parent (PR_SET_PDEATHSIG)
[ -d "$live" ] || fail "the store folder went with the SIGKILLed launcher; nothing to test"
"$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 1000000 --data synthetic --quiet \
  --log_dir "$tmp/log6" --metrics "$tmp/m6.jsonl" >/dev/null 2>&1 &
second=$!
training "$tmp/m6.jsonl" 1 "$second"
[ -d "$live" ] && fail "the dead launcher's store folder $live is still there"
[ "$(ls -d "$TMPDIR"/strata_store.* | wc -l)" -eq 1 ] || fail "the live job's folder was removed"
kill -TERM $second
wait $second
unset TMPDIR
echo "ok: a SIGKILLed launcher's store folder is removed by the next run, the live job's kept"
echo "PASS"
