#!/usr/bin/env bash
# `strata check` on a pipeline says what a user needs to balance it: each
# stage's share of the estimated work, each rank's predicted peak and bubble,
# and the schedule diagram. On the AlexNet example the convolutions make
# stage 0 the heavy one, so rank 1 idles most of the step.
set -uo pipefail
strata=$1
program=$2
strategy=$3
fail() { echo "FAIL: $*"; exit 1; }

out=$("$strata" check "$program" --strategy "$strategy" 2>&1) || fail "check failed: $out"
echo "$out"
share() { echo "$out" | grep "^  stage $1:" | sed -n 's/.*, \([0-9]*\)% of the work.*/\1/p'; }
s0=$(share 0)
s1=$(share 1)
[ -n "$s0" ] && [ -n "$s1" ] || fail "no work shares in the stage lines"
[ $((s0 + s1)) -ge 99 ] && [ $((s0 + s1)) -le 101 ] || fail "work shares $s0% + $s1% do not add up to 100%"
[ "$s0" -gt 60 ] || fail "the convolution stage has only $s0% of the work"
bubble() { echo "$out" | grep "^  rank $1:" | sed -n 's/.*bubble \([0-9.]*\)%.*/\1/p'; }
b0=$(bubble 0)
b1=$(bubble 1)
[ -n "$b0" ] && [ -n "$b1" ] || fail "no bubbles in the rank lines"
awk -v a="$b0" -v b="$b1" 'BEGIN { exit !(b > 50 && a < b) }' || fail "expected the light rank 1 to idle most: bubbles $b0% and $b1%"
echo "$out" | grep -q "predicted peak" || fail "no predicted peak"
echo "$out" | grep -qE "^    rank 0 \|[0-9a-z.+*]+\|$" || fail "no schedule diagram"
echo "PASS"
