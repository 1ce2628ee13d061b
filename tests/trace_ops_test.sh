#!/usr/bin/env bash
# tools/trace_ops.py over a real trace: a 2-stage pipeline trained 3 steps
# with --trace. Without --skip_steps every op event counts (the op total
# equals the trace's own op events; transfers are listed apart); --skip_steps 1 leaves 2 steps, per step;
# --skip_steps 3 (as many as the trace has) is refused naming the count.
set -uo pipefail
strata=$1
program=$2
strategy=$3
tool=$4
tmp=${TEST_TMPDIR:-$(mktemp -d)}
fail() { echo "FAIL: $*"; exit 1; }

"$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 3 --quiet --trace "$tmp/trace.json" \
  >"$tmp/run.txt" 2>&1 || fail "run: $(cat "$tmp/run.txt")"
want=$(/usr/bin/python3 -c '
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
print(sum(1 for e in ev if e.get("ph") == "X" and e.get("cat") == "op"))' "$tmp/trace.json")
all=$(/usr/bin/python3 "$tool" "$tmp/trace.json" --top 100) || fail "trace_ops: $all"
head -1 <<<"$all" | grep -q "over 3 steps" || fail "no step count: $all"
got=$(echo "$all" | awk '/^all ops/ {print $NF}')
# count per step over 3 steps, times 3: the trace's own op events
/usr/bin/python3 -c "import sys; sys.exit(abs(float('$got') * 3 - $want) > 1e-6)" ||
  fail "op events: trace_ops counts $got a step, the trace holds $want"
grep -qE "^matmul +[0-9.]+ " <<<"$all" || fail "no matmul row: $all"
# Transfers sum by type apart from the ops (host time, not device time):
# one send row and one recv row after the ops, not a row per var and micro-batch.
transfers=$(sed -n '/^transfers /,$p' <<<"$all")
[ "$(grep -cE '^send ' <<<"$transfers")" = 1 ] && [ "$(grep -cE '^recv ' <<<"$transfers")" = 1 ] ||
  fail "transfers not by type after the ops: $all"
skipped=$(/usr/bin/python3 "$tool" "$tmp/trace.json" --skip_steps 1) || fail "--skip_steps 1: $skipped"
head -1 <<<"$skipped" | grep -q "over 2 steps" || fail "--skip_steps 1: $skipped"
if out=$(/usr/bin/python3 "$tool" "$tmp/trace.json" --skip_steps 3 2>&1); then fail "--skip_steps 3 passed: $out"; fi
grep -q "the trace has 3 steps" <<<"$out" || fail "--skip_steps 3: $out"
echo PASS
