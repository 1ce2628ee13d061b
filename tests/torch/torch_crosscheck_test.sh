#!/bin/bash
# Runs Strata's side of the cross-check (the driver), then torch's side (the
# python script, which compares and exits 1 on any mismatch).
set -euo pipefail

here="${TEST_SRCDIR:?run under bazel test}/${TEST_WORKSPACE:-strata}/tests/torch"
out="${TEST_TMPDIR:?}/torch_crosscheck"
python=/usr/bin/python3  # Debian's interpreter with torch; the python3 on PATH has none

if ! "$python" -c "import torch, numpy" 2>/dev/null; then
  echo "FAIL: $python cannot import torch and numpy (apt-get install --no-install-recommends python3-torch)" >&2
  exit 1
fi
# Both sides compute with the same thread count (torch reads it from case.json).
export STRATA_NUM_THREADS="${STRATA_NUM_THREADS:-2}"

rm -rf "$out"
"$here/torch_crosscheck_driver" --out "$out"
"$python" "$here/torch_crosscheck.py" "$out"
