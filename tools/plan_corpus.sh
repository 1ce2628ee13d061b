#!/bin/bash
# The plan corpus: what `strata` makes of a fixed set of programs and
# strategies, recorded so that a refactor can show it changed nothing.
#
#   tools/plan_corpus.sh record STRATA_BIN OUT_DIR [--jobs N]
#   tools/plan_corpus.sh diff OLD_DIR NEW_DIR [--lines N] [--files N]
#
# record runs, for every program x strategy: `check`, `check --device gpu`,
# `compile --out`, `compile --device gpu --out` and `compile --dump_after P`
# for every pass P the tool names when asked for `--dump_after bogus`, and
# writes OUT_DIR/cases/PROGRAM/STRATEGY/VARIANT/run.txt (the command, exit
# code or signal, stdout, stderr, the files written) and files/ (every file
# compile wrote; a dump's plans equal to the plain compile's are named, not
# copied). Also meta/ (the tool's --help texts, the pass list's source),
# gen/ (each `strata gen` run), corpus.txt (the inputs with their sha256) and
# recording.txt (which binary; diff ignores it). Runs happen in a temporary
# folder with relative paths, a fixed environment (LC_ALL=C, TZ=UTC) and
# <WORK>/<STRATA> in place of the folder's and binary's paths, so two records
# of one binary are byte-identical. 45 s to 2.5 min on the shared 2-core
# machine, depending on its load.
#
# The corpus: examples/*.pbtxt, tests/fuzz/*.pbtxt and tools/plan_corpus/*.pbtxt
# programs, the `strata gen` programs listed in tools/plan_corpus.py (GENERATED),
# and the strategies none, examples/*.strategy.pbtxt, tests/fuzz/*.strategy.pbtxt
# and tools/plan_corpus/*.strategy.pbtxt. A pipeline strategy's stage count
# comes from the program's placements, so every strategy meets 1 to 4 stages.
# Invalid pairs are part of the corpus: their errors are recorded too.
#
# diff compares two recordings file by file after normalising .pbtxt files:
# the fields in STRIP_ALWAYS (topology.mesh, topology.coordinate,
# topology.group: whole messages) are removed from both sides, and fields
# named like a device (NEW_ONLY_NAMES) are removed from NEW where OLD's file
# has no field at that path; the plans' fingerprint (a hash of every rank's
# plan) is removed too where those fields differ. Edit the lists in
# tools/plan_corpus.py (STRIP_ALWAYS, NEW_ONLY_NAMES, DERIVED, STRIP_LINES)
# when a refactor stage adds fields of its own. Exit 0: identical; 1: it
# prints the first lines of each file's unified diff (line numbers are the
# normalised files') and a count; 2: usage error.
#
# Checking a refactor (use this checkout's script and corpus for both sides):
#   git worktree add /tmp/strata-old OLD_COMMIT
#   (cd /tmp/strata-old && bazel build -c opt //tools:strata)
#   tools/plan_corpus.sh record /tmp/strata-old/bazel-bin/tools/strata /tmp/corpus-old
#   bazel build -c opt //tools:strata
#   tools/plan_corpus.sh record bazel-bin/tools/strata /tmp/corpus-new
#   tools/plan_corpus.sh diff /tmp/corpus-old /tmp/corpus-new
# Every difference left should be explained in the refactor's commit.
# Not a Bazel test: comparing the tool with itself in CI would prove nothing.
set -euo pipefail
exec /usr/bin/python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/plan_corpus.py" "$@"
