#!/bin/bash
# bazel run //bench:dispatch -- [--threads N] [--rounds R]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Under bazel run the data files sit in the runfiles tree beside this script.
runfiles="${RUNFILES_DIR:-$0.runfiles}/strata/bench"
[[ -d "$runfiles" ]] || runfiles="$here"
exec /usr/bin/python3 "$runfiles/dispatch.py" --strata "$runfiles/dispatch_bench" "$@"
