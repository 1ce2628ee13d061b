#!/usr/bin/env bash
# Faults in a multi-process job: a rank killed mid-step ends the job non-zero
# within 30 s naming the rank, with no process left behind, and a stalled
# one after --comm_timeout_s (rank_fault_check.sh); ranks that compiled
# different programs refuse to start, naming both fingerprints.
set -uo pipefail
strata=$1
program=$2
strategy=$3
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source "$(dirname "$0")/job_lib.sh"

# 1. A rank killed mid-step, and one that stops answering (shared with
#    tools/gpu_check.sh, which runs them with --device gpu).
bash "$(dirname "$0")/rank_fault_check.sh" "$strata" "$program" "$strategy" || exit 1

# 2. Two ranks with different programs meet at the store and refuse to run.
sed 's/learning_rate: 0.001/learning_rate: 0.002/' "$program" > "$tmp/other.pbtxt"
cmp -s "$program" "$tmp/other.pbtxt" && fail "could not make a different program"
store="$tmp/store"; mkdir -p "$store"
STRATA_RANK=0 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" \
  timeout 60 "$strata" run "$program" --strategy "$strategy" --steps 5 --data synthetic --quiet 2>"$tmp/r0.txt" &
r0=$!
STRATA_RANK=1 STRATA_WORLD_SIZE=2 STRATA_STORE="file://$store" \
  timeout 60 "$strata" run "$tmp/other.pbtxt" --strategy "$strategy" --steps 5 --data synthetic --quiet 2>"$tmp/r1.txt"
rc1=$?
wait $r0
rc0=$?
echo "rank 0: $rc0 $(cat "$tmp/r0.txt")"
echo "rank 1: $rc1 $(cat "$tmp/r1.txt")"
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] || fail "ranks with different programs did not both refuse"
[ $rc0 -ne 124 ] && [ $rc1 -ne 124 ] || fail "a rank hung instead of refusing"
grep -qi "fingerprint\|compiled" "$tmp/r1.txt" || fail "rank 1's error does not explain the mismatch"

# 3. The ranks meet through a real Redis server (--store redis://).
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --bind 127.0.0.1 --port "$port" --save '' --daemonize no >"$tmp/redis.log" 2>&1 &
redis=$!
trap 'kill $redis 2>/dev/null' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
"$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 3 --data synthetic --quiet \
  --store "redis://127.0.0.1:$port" >"$tmp/out4.txt" 2>"$tmp/err4.txt" || fail "the job over redis failed: $(cat "$tmp/err4.txt")"
grep -q "final train loss" "$tmp/out4.txt" || fail "the job over redis reported no loss"

# 4. Workers started by an external launcher (torchrun's environment): rank 0
#    serves the store on MASTER_ADDR:MASTER_PORT; rank 1 starts first and waits.
port5=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port5 \
  timeout 60 "$strata" run "$program" --strategy "$strategy" --steps 3 --data synthetic --quiet \
  >"$tmp/t1.txt" 2>&1 &
t1=$!
sleep 0.5
RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port5 \
  timeout 60 "$strata" run "$program" --strategy "$strategy" --steps 3 --data synthetic --quiet \
  >"$tmp/t0.txt" 2>&1 || fail "torchrun-style rank 0 failed: $(cat "$tmp/t0.txt")"
wait $t1 || fail "torchrun-style rank 1 failed: $(cat "$tmp/t1.txt")"
grep -q "final train loss" "$tmp/t1.txt" || fail "the torchrun-style job reported no loss"
# A rank whose rank 0 never starts ends after --comm_timeout_s, naming the store.
port5b=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
start=$(date +%s)
RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port5b \
  timeout 60 "$strata" run "$program" --strategy "$strategy" --steps 1 --data synthetic --quiet --comm_timeout_s 2 \
  >"$tmp/t2.txt" 2>&1 && fail "a rank with no rank 0 succeeded"
took=$(( $(date +%s) - start ))
[ "$took" -le 10 ] || fail "a rank with no rank 0 took ${took}s to give up (timeout 2s)"
grep -q "cannot reach the store" "$tmp/t2.txt" || fail "no 'cannot reach the store' in: $(cat "$tmp/t2.txt")"

# 5. The job's trace has a track per rank with every forward and backward by
#    micro-batch, the transfers and the optimizer; --compare_single prints
#    both loss columns.
"$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 2 --data synthetic --quiet \
  --trace "$tmp/trace.json" --compare_single >"$tmp/out6.txt" 2>"$tmp/err6.txt" || fail "traced job failed: $(cat "$tmp/err6.txt")"
/usr/bin/python3 - "$tmp/trace.json" <<'PY' || fail "bad trace"
import json, sys
events = [e for e in json.load(open(sys.argv[1]))["traceEvents"] if e.get("ph") == "X"]
for rank in (0, 1):
    names = {e["name"] for e in events if e["tid"] == rank and e["cat"] == "action"}
    want = {"F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3", "OPT"}
    assert want <= names, (rank, sorted(names))
    assert any(e["cat"] == "comm" and e["tid"] == rank for e in events), rank
assert any(e["name"].startswith("send") for e in events) and any(e["name"].startswith("recv") for e in events)
# Every transfer carries its payload and its CPU time; a send and the recv
# of the same channel and micro-batch agree on the bytes.
payload = {}
for e in events:
    if e["cat"] != "comm":
        continue
    assert e["args"]["bytes"] > 0 and e["args"]["cpu_us"] >= 0, e
    kind, rest = e["name"].split(" ", 1)
    payload.setdefault(rest, {}).setdefault(kind, set()).add(e["args"]["bytes"])
for rest, kinds in payload.items():
    assert set(kinds) == {"send", "recv"} and kinds["send"] == kinds["recv"], (rest, kinds)
PY
grep -q "single_loss" "$tmp/out6.txt" && grep -q "max relative difference" "$tmp/out6.txt" || fail "--compare_single printed no comparison"
[ ! -e "$tmp/trace.json.rank0" ] || fail "the per-rank trace parts were left behind"
echo PASS
