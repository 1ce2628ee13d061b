#!/bin/bash
# bazel run //bench:allreduce -- [--rounds R] [--sizes 1024,4096,...]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
runfiles="${RUNFILES_DIR:-$0.runfiles}/strata"
[[ -d "$runfiles" ]] || runfiles="$here/.."
exec /usr/bin/python3 "$runfiles/bench/allreduce.py" --strata_bin "$runfiles/bench/allreduce_strata" \
  --strata "$runfiles/tools/strata" "$@"
