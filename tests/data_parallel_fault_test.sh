#!/usr/bin/env bash
# Faults inside a data-parallel gradient bucket's allreduce
# (runtime/fault_injection.h): a rank that dies there ends the job at once,
# one that stalls there (SIGSTOP: alive, its heartbeat stopped) ends it
# through the heartbeat; either way the user reads which rank, and the
# survivor's error which group and bucket. Every run is under `timeout`, so
# the test cannot hang.
set -uo pipefail
strata=$1
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }
# Any worker still alive is this test's (its argv holds the program's path
# under $tmp); none may outlive its launcher.
leftovers() { pgrep -f -- "$tmp/" | while read -r pid; do
  [ "$(ps -o stat= -p "$pid" | cut -c1)" = "Z" ] || echo "$pid"; done; }
trap 'for pid in $(leftovers); do kill -KILL "$pid"; done' EXIT

# dp2 with several buckets (bucket_mb 0.001: about 1 KB each), and pp2xdp2.
"$strata" gen mlp --layers 64,32,10 >"$tmp/mlp.pbtxt" || fail "gen mlp"
echo 'data_parallel { degree: 2 bucket_mb: 0.001 }' >"$tmp/dp2.strategy.pbtxt"
"$strata" gen mlp --layers 64,32,10 --stages 2 >"$tmp/mlp_pp2.pbtxt" || fail "gen mlp --stages 2"
printf 'pipeline { micro_batch_size: 4 accumulate_steps: 2 }\ndata_parallel { degree: 2 }\n' \
  >"$tmp/pp2dp2.strategy.pbtxt"

# Runs a job with STRATA_FAULT=$1 (then the run's args) into $tmp/$case.*;
# sets rc and elapsed.
run_fault() {
  local fault=$1
  shift
  local start
  start=$(date +%s.%N)
  STRATA_FAULT=$fault timeout 60 "$strata" run "$@" --steps 1000000 --data synthetic --quiet \
    --log_dir "$tmp/$case.log" >"$tmp/$case.out" 2>"$tmp/$case.err"
  rc=$?
  elapsed=$(echo "$(date +%s.%N) - $start" | bc)
  echo "$case: exit $rc after ${elapsed}s"
  grep -v '^\[rank' "$tmp/$case.err"
  [ $rc -ne 124 ] || fail "$case: the job hung (killed by timeout after 60 s)"
  [ $rc -ne 0 ] || fail "$case: the job exited 0"
  [ "$(grep -c '^error:' "$tmp/$case.err")" -eq 1 ] || fail "$case: not one error line"
  [ -z "$(leftovers)" ] || fail "$case: workers left running: $(leftovers)"
}
# "allreduce of bucket 0 (2 gradients, F32[330]) over group 1 (dp: ranks 0, 1)"
bucket_of() { echo "allreduce of bucket $1 ([0-9]* gradients*, F32\[[0-9]*\]) over group [0-9]* (dp: ranks $2)"; }

# 1. dp2: rank 1 exits right after posting bucket 0's allreduce in step 3.
#    The launcher names rank 1's own exit, not rank 0's "connection lost";
#    rank 0's error names the bucket and the group it lost.
case=dp_exit
run_fault bucket_allreduce_exit:rank=1:step=3 "$tmp/mlp.pbtxt" --strategy "$tmp/dp2.strategy.pbtxt" --nproc 2 \
  --batch_size 16
(( $(echo "$elapsed < 30" | bc) )) || fail "$case: the job took ${elapsed}s to end (limit 30 s)"
error=$(grep '^error:' "$tmp/$case.err")
echo "$error" | grep -q "^error: rank 1 failed (exit 86): rank 1: fault injected at bucket_allreduce_exit" ||
  fail "$case: the error does not name rank 1's exit: $error"
echo "$error" | grep -q "connection lost" && fail "$case: the error names a consequence: $error"
survivor=$(grep '^error:' "$tmp/$case.log/workerlog.0")
echo "$survivor" | grep -q "^error: rank 0: step 3: op #[0-9]* 'bucket_wait': $(bucket_of 0 "0, 1")" ||
  fail "$case: rank 0's error does not name bucket 0 and the dp group: $survivor"
echo "$survivor" | grep -q "connection lost" || fail "$case: rank 0's error does not say it lost its peer: $survivor"
# The launcher passes the survivor's error on to the user.
grep -q "^note: then rank 0: .*$(bucket_of 0 "0, 1")" "$tmp/$case.err" || fail "$case: no note of rank 0's error"

# 2. dp2: rank 1 stops (SIGSTOP) right after posting bucket 0's allreduce in
#    step 3. Rank 0 waits for the bucket; the heartbeat (3 s), not the
#    communication timeout (60 s), ends the job, and the launcher's line says
#    which bucket and group rank 0 was waiting for.
case=dp_stall
run_fault bucket_allreduce_stall:rank=1:step=3 "$tmp/mlp.pbtxt" --strategy "$tmp/dp2.strategy.pbtxt" --nproc 2 \
  --batch_size 16 --heartbeat_timeout_s 3 --comm_timeout_s 60
grep -q "fault injected at bucket_allreduce_stall .*: stopping (SIGSTOP)" "$tmp/$case.log/workerlog.1" ||
  fail "$case: rank 1 did not stall where asked: $(cat "$tmp/$case.log/workerlog.1")"
(( $(echo "$elapsed < 30" | bc) )) || fail "$case: the stall was found after ${elapsed}s (heartbeat timeout 3 s)"
error=$(grep '^error:' "$tmp/$case.err")
echo "$error" | grep -q "^error: rank 0 failed (exit 1): rank 0: rank 1 is unresponsive: .*; rank 0 was waiting for $(bucket_of 0 "0, 1")" ||
  fail "$case: the error does not name rank 1, bucket 0 and the dp group: $error"

# 3. pp2xdp2: rank 3 (the last stage's second replica) exits inside its
#    bucket's allreduce in step 3; the job ends naming rank 3, and its dp
#    peer, rank 1, names the bucket and their group.
case=pp2dp2_exit
run_fault bucket_allreduce_exit:rank=3:step=3 "$tmp/mlp_pp2.pbtxt" --strategy "$tmp/pp2dp2.strategy.pbtxt" --nproc 4
(( $(echo "$elapsed < 30" | bc) )) || fail "$case: the job took ${elapsed}s to end (limit 30 s)"
error=$(grep '^error:' "$tmp/$case.err")
echo "$error" | grep -q "^error: rank 3 failed (exit 86): rank 3: fault injected at bucket_allreduce_exit" ||
  fail "$case: the error does not name rank 3's exit: $error"
peer=$(grep '^error:' "$tmp/$case.log/workerlog.1")
echo "$peer" | grep -q "^error: rank 1: step 3: op #[0-9]* 'bucket_wait': $(bucket_of 0 "1, 3")" ||
  fail "$case: rank 1's error does not name bucket 0 and the dp group: $peer"
echo PASS
