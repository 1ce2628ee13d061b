#!/bin/bash
# bazel run //bench:recompute -- [--rounds R] [--steps S] [--models resmlp,convnet]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
runfiles="${RUNFILES_DIR:-$0.runfiles}/strata"
[[ -d "$runfiles" ]] || runfiles="$here/.."
exec /usr/bin/python3 "$runfiles/bench/recompute.py" --strata "$runfiles/tools/strata" "$@"
