#!/usr/bin/env bash
# Every flag tools/cli_flags.cc defines is one some command takes: a flag
# missing from CommandFlags() is refused as unknown by every command (as
# --cuda_graph and --nccl were until 2026-11-27, which bench/gpt2.py and
# tools/gpu_check.sh pass). And `strata run --cuda_graph` on the CPU runs
# without a note: the flag is on by default and only GPU runs capture.
set -uo pipefail
strata=$1
flags_cc=$2
program=$3
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for c in check compile run gen; do "$strata" "$c" --help >>"$tmp/help" 2>&1; done
names=$(grep -oE '^ABSL_FLAG\([^,]+, *[a-z_0-9]+' "$flags_cc" | sed -E 's/.*, *//')
[ -n "$names" ] || fail "no ABSL_FLAG found in $flags_cc"
# Every definition's name was read (none split over lines or typed with a comma).
[ "$(wc -w <<<"$names")" -eq "$(grep -c '^ABSL_FLAG(' "$flags_cc")" ] || fail "could not read every ABSL_FLAG's name"
count=0
for n in $names; do
  grep -qE "^  --$n( |$)" "$tmp/help" || fail "--$n is defined but no command's --help lists it"
  count=$((count + 1))
done
echo "ok: $count flags, each taken by a command"

out=$("$strata" run "$program" --data synthetic --steps 2 --quiet --cuda_graph --nccl=false 2>&1) ||
  fail "run --cuda_graph --nccl=false on the CPU: $out"
grep -q "note: --cuda_graph" <<<"$out" && fail "a CPU run spoke of CUDA graphs: $out"
grep -q "final train loss" <<<"$out" || fail "run --cuda_graph on the CPU did not train: $out"
echo "ok: run --cuda_graph on the CPU trains without a note"

# STRATA_NUM_THREADS is checked as a flag is: a value past the thread limit
# aborted the process (std::system_error creating threads), and one that is
# not a count was ignored. Each is one error line and exit 2; a count trains.
for v in 100000 abc 0; do
  out=$(STRATA_NUM_THREADS=$v "$strata" run "$program" --data synthetic --steps 2 --quiet 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "STRATA_NUM_THREADS=$v: exit $rc, expected 2: $out"
  [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "^error: STRATA_NUM_THREADS='$v': expected a thread count from 1 to 1024$" <<<"$out" ||
    fail "STRATA_NUM_THREADS=$v: expected one error line, got: $out"
done
out=$(STRATA_NUM_THREADS=3 "$strata" run "$program" --data synthetic --steps 2 --quiet 2>&1) ||
  fail "STRATA_NUM_THREADS=3: $out"
grep -q "final train loss" <<<"$out" || fail "STRATA_NUM_THREADS=3 did not train: $out"
echo "ok: STRATA_NUM_THREADS out of 1..1024 or not a count is one error line, exit 2"

# STRATA_SPIN_US (how long idle threads poll before they sleep) likewise.
for v in -1 abc 2000000; do
  out=$(STRATA_SPIN_US=$v "$strata" run "$program" --data synthetic --steps 2 --quiet 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "STRATA_SPIN_US=$v: exit $rc, expected 2: $out"
  [ "$(wc -l <<<"$out")" -eq 1 ] && grep -q "^error: STRATA_SPIN_US='$v': expected microseconds from 0 to 1000000$" <<<"$out" ||
    fail "STRATA_SPIN_US=$v: expected one error line, got: $out"
done
for v in 0 100; do
  out=$(STRATA_SPIN_US=$v "$strata" run "$program" --data synthetic --steps 2 --quiet 2>&1) || fail "STRATA_SPIN_US=$v: $out"
  grep -q "final train loss" <<<"$out" || fail "STRATA_SPIN_US=$v did not train: $out"
done
echo "ok: STRATA_SPIN_US out of 0..1000000 or not a number is one error line, exit 2"

# Where the system refuses threads (here an address-space limit too small
# for 1024 thread stacks), the pool starts fewer and says so, and the run
# trains rather than aborts on std::thread's exception.
out=$( (ulimit -v 4000000; STRATA_NUM_THREADS=1024 "$strata" run "$program" --data synthetic --steps 2 --quiet) 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "1024 threads under ulimit -v: exit $rc: $out"
grep -q "final train loss" <<<"$out" || fail "1024 threads under ulimit -v did not train: $out"
grep -q "^note: the system started [0-9]* of the 1024 intra-op threads asked for" <<<"$out" ||
  fail "1024 threads under ulimit -v: no note of the threads started: $out"
started=$(sed -n 's/^note: the system started \([0-9]*\) of the 1024.*/\1/p' <<<"$out")
grep -q "^done: .*, $started threads)" <<<"$out" ||
  fail "1024 threads under ulimit -v: the done line does not say the $started threads computing: $out"
echo "ok: a pool the system refuses threads to starts fewer and trains"

# An argument with a newline or a terminal escape is refused, quoted
# escaped on one line (it would split the error that quotes it).
out=$("$strata" run "$program" --data $'bo\ngus\033[2J' 2>&1)
rc=$?
[ "$rc" -eq 2 ] || fail "control characters in an argument: exit $rc: $out"
[ "$(wc -l <<<"$out")" -eq 1 ] || fail "control characters in an argument: not one line: $out"
grep -qF "'bo\ngus\x1b[2J' contains a control character" <<<"$out" || fail "control characters in an argument: $out"
echo "ok: an argument with control characters is one escaped error line"

# --disable_passes takes "a, b" as a list of two, as a person types it.
out=$("$strata" check "$program" --disable_passes "pack-qkv, attention-layout" 2>&1) ||
  fail "--disable_passes with a space after the comma: $out"
echo "ok: --disable_passes 'pack-qkv, attention-layout'"
