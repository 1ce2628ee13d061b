#!/bin/bash
# bazel run //bench:train_step -- [--threads N] [--rounds R] [--models mlp,convnet]
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Under bazel run the data files sit in the runfiles tree beside this script.
runfiles="${RUNFILES_DIR:-$0.runfiles}/strata/bench"
[[ -d "$runfiles" ]] || runfiles="$here"
exec /usr/bin/python3 "$runfiles/train_step.py" --strata "$runfiles/train_step_strata" "$@"
