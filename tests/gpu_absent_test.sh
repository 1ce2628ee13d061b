#!/usr/bin/env bash
# strata_gpu (the tool with the CUDA kernels linked) where no GPU is visible
# (CUDA_VISIBLE_DEVICES empty, so on a GPU machine too): `run --device gpu`
# fails with one `error:` line and exit code 1, before anything trains; the
# same command on the CPU trains (the binary itself is sound).
set -uo pipefail
strata_gpu=$1
program=$2
fail() { echo "FAIL: $*"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

CUDA_VISIBLE_DEVICES= "$strata_gpu" run "$program" --device gpu --data synthetic --steps 2 --quiet \
  >"$tmp/out" 2>"$tmp/err"
rc=$?
[ "$rc" -eq 1 ] || fail "exit code $rc, expected 1; stderr: $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "expected one stderr line, got: $(cat "$tmp/err")"
grep -q '^error: --device gpu: no CUDA device: ' "$tmp/err" || fail "unexpected error line: $(cat "$tmp/err")"
[ ! -s "$tmp/out" ] || fail "wrote to stdout: $(cat "$tmp/out")"
echo "ok: $(cat "$tmp/err")"

CUDA_VISIBLE_DEVICES= "$strata_gpu" run "$program" --device cpu --data synthetic --steps 2 --quiet >"$tmp/out" 2>&1 ||
  fail "the CPU run failed: $(cat "$tmp/out")"
grep -q "final train loss" "$tmp/out" || fail "the CPU run did not train: $(cat "$tmp/out")"
echo "ok: the same binary trains on the CPU"
