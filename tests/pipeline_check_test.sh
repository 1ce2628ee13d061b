#!/usr/bin/env bash
# `strata check` on a pipeline says what a user needs to balance it: each
# stage's share of the estimated work, each rank's predicted peak and bubble,
# and the schedule diagram. The AlexNet example, placed by `strata gen
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
echo "PASS"
