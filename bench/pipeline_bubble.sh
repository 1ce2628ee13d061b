#!/bin/bash
# bazel run //bench:pipeline_bubble -- [--steps N] [--width W] [--threads T]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
runfiles="${RUNFILES_DIR:-$0.runfiles}/strata"
[[ -d "$runfiles" ]] || runfiles="$here/.."
exec /usr/bin/python3 "$runfiles/bench/pipeline_bubble.py" --strata "$runfiles/tools/strata" "$@"
