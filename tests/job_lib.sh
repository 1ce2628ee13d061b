# Helpers of the shell tests that start a job and act on it while it trains
# (sourced).

fail() { echo "FAIL: $*"; exit 1; }

# Waits until the metrics file $1 has $2 step lines: the ranks are past the
# rendezvous and the settings agreement and train (a fixed sleep can act
# before that on a loaded machine: pipeline_fault_test stopped a rank in the
# settings check 9 times in 15 runs under load). After 60 s it kills the
# process $3, if given (a job of a million steps), and fails.
training() {
  for _ in $(seq 600); do
    n=$(grep -c '"step"' "$1" 2>/dev/null)  # nothing while the file is not there yet
    [ "${n:-0}" -ge "$2" ] && return
    # A job that ended before training (it failed at start) is said at once, not after the 60 s.
    if [ -n "${3:-}" ] && ! kill -0 "$3" 2>/dev/null; then
      n=$(grep -c '"step"' "$1" 2>/dev/null)  # what it wrote before it ended
      [ "${n:-0}" -ge "$2" ] && return
      fail "the job ended before $2 steps of training ($1)"
    fi
    sleep 0.1
  done
  [ -n "${3:-}" ] && kill "$3" 2>/dev/null
  fail "no training in $1 within 60 s"
}
