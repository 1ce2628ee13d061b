#!/usr/bin/env bash
# Two faults of a running two-rank job, on any device:
#   rank_fault_check.sh STRATA PROGRAM STRATEGY [RUN FLAGS...]
# 1. A rank killed mid-step: the job ends non-zero within 30 s naming it,
#    with no worker left behind.
# 2. A rank that stops answering (SIGSTOP): the other's transfer gives up
#    after --comm_timeout_s and the job ends naming the channel (or the
#    collective that agrees whether to stop).
# pipeline_fault_test.sh runs it on the CPU; tools/gpu_check.sh with
# --device gpu (the ranks sharing the one GPU over staged Gloo), so that the
# pipeline's fault tests hold on a GPU too. Needs bash, coreutils, procps.
set -uo pipefail
strata=$1
program=$2
strategy=$3
shift 3
run_flags=("$@")
tmp=${TEST_TMPDIR:-$(mktemp -d)}
source "$(dirname "$0")/job_lib.sh"
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# On a failure, what the jobs said (a job that could not start fails in
# `training`); also when killed from outside (gpu_check's timeout), where
# bash runs the trap with status 0, so the flag, not $?, tells.
trap '[ -n "${passed:-}" ] || tail -n 5 "$tmp"/err*.txt 2>/dev/null' EXIT

# Starts a two-rank job of a million steps named $1 (its files $tmp/$1.* and
# $tmp/err-$1.txt), with the run flags after it, and waits until it trains:
# sets `launcher` and `children`.
start_job() {
  local name=$1
  shift
  "$strata" run "$program" --strategy "$strategy" --nproc 2 --steps 1000000 --data synthetic --quiet \
    --log_dir "$tmp/$name.log" --metrics "$tmp/$name.jsonl" "$@" "${run_flags[@]}" \
    >"$tmp/$name.out" 2>"$tmp/err-$name.txt" &
  launcher=$!
  training "$tmp/$name.jsonl" 3 "$launcher"
  children=$(pgrep -P $launcher)
}

# The job $1 after its fault (at `start`): it must end non-zero within 30 s.
ends_failing() {
  wait $launcher
  local rc=$? elapsed
  elapsed=$(ms_since "$start")
  echo "$1: the job exited $rc after ${elapsed} ms: $(grep '^error' "$tmp/err-$1.txt")"
  [ $rc -ne 0 ] || fail "$1: the job exited 0"
  [ "$elapsed" -lt 30000 ] || fail "$1: the job took ${elapsed} ms to end (limit 30 s)"
}

# 1. Kill rank 1 while the job trains.
start_job killed
[ "$(echo "$children" | wc -w)" -eq 2 ] || fail "expected 2 workers, found: $children"
victim=$(echo "$children" | sed -n 2p)
victim_rank=$(tr '\0' '\n' < "/proc/$victim/environ" | sed -n 's/^STRATA_RANK=//p')
start=$(date +%s%N)
kill -9 "$victim"
ends_failing killed
# The killed rank recorded nothing; the survivor's "connection lost" that
# followed is its consequence, not the cause.
grep -q "^error: rank $victim_rank failed (killed by SIGKILL)" "$tmp/err-killed.txt" ||
  fail "the error does not name the killed rank $victim_rank: $(grep '^error' "$tmp/err-killed.txt")"
for pid in $children; do
  if kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != "Z" ]; then fail "worker $pid is still running"; fi
done

# 2. A rank that stops answering: the other's receive gives up after
#    --comm_timeout_s and the job ends naming the channel.
start_job stalled --comm_timeout_s 3
frozen=$(echo "$children" | sed -n 1p)
kill -STOP "$frozen"
start=$(date +%s%N)
ends_failing stalled
# A transfer names its channel; the periodic stop agreement between steps
# (where a rank frozen between steps leaves the other) names its collective.
grep -qE "channel|agreeing whether to stop: allreduce #[0-9]+" "$tmp/err-stalled.txt" ||
  fail "the timeout error names neither the channel nor the collective"
kill -0 "$frozen" 2>/dev/null && [ "$(ps -o stat= -p "$frozen" | cut -c1)" != "Z" ] && fail "the stalled worker was left behind"
passed=1
echo "rank faults: PASS${run_flags[*]:+ (${run_flags[*]})}"
