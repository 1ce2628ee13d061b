#!/bin/bash
# bazel run //bench:data_parallel -- [--rounds R] [--models mlp,convnet]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
runfiles="${RUNFILES_DIR:-$0.runfiles}/strata"
[[ -d "$runfiles" ]] || runfiles="$here/.."
exec /usr/bin/python3 "$runfiles/bench/data_parallel.py" --strata "$runfiles/tools/strata" "$@"
