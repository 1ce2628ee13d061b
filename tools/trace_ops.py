"""Sums a `strata run --trace` file's op events by op type: the time each
type took, its count and its share, largest first. On a GPU the trace waits
for each op's kernels, so these are device times. Pipeline transfers follow
apart, by type (send, recv): host time posting a send and waiting for a
receive, which holds the peer's delay (the bubble), not device time.

  python3 tools/trace_ops.py TRACE.json [--top N] [--skip_steps K]

--skip_steps K drops the ops of the first K steps (a step ends with its
optimizer action, OPT): the first step pays for plans and allocations. Times
are then per step over the steps left, when the trace has OPT actions.
"""

import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--skip_steps", type=int, default=0)
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("trace_ops: %s: %s" % (a.trace, e))
    # Step ends per track (pid, tid): where each OPT action ends.
    ends = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "action" and e.get("name") == "OPT":
            ends[(e.get("pid"), e.get("tid"))].append(e["ts"] + e["dur"])
    for v in ends.values():
        v.sort()
    steps = min((len(v) for v in ends.values()), default=0)
    if a.skip_steps < 0 or (a.skip_steps > 0 and a.skip_steps >= steps):
        sys.exit("trace_ops: --skip_steps %d: the trace has %d steps" % (a.skip_steps, steps))
    total = {"op": collections.Counter(), "comm": collections.Counter()}
    count = {"op": collections.Counter(), "comm": collections.Counter()}
    for e in events:
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in ("op", "comm"):
            continue
        track = ends.get((e.get("pid"), e.get("tid")))
        if a.skip_steps and track and e["ts"] < track[a.skip_steps - 1]:
            continue
        # A transfer's event names its var, ranks and micro-batch ("send h2
        # 0->1 mb 0"); its type is the first word.
        name = e["name"].split(" ", 1)[0] if cat == "comm" else e["name"]
        total[cat][name] += e["dur"]
        count[cat][name] += 1
    whole = sum(total["op"].values())
    if whole == 0:
        sys.exit("trace_ops: %s holds no op events" % a.trace)
    per = steps - a.skip_steps if steps else 1
    unit = "ms/step" if steps else "ms"
    print("%-40s %10s %7s %6s   (%s over %d step%s)" % ("op", unit, "count", "share", unit, per, "" if per == 1 else "s"))
    for name, us in total["op"].most_common(a.top):
        print("%-40s %10.2f %7.1f %5.1f%%" % (name, us / 1e3 / per, count["op"][name] / per, 100.0 * us / whole))
    print("%-40s %10.2f %7.1f" % ("all ops", whole / 1e3 / per, sum(count["op"].values()) / per))
    if total["comm"]:
        # Not device time: a send's event is its posting, a recv's its wait,
        # which holds the time the peer took to send (the pipeline's bubble).
        print("transfers (host time posting sends and waiting for receives, the peers' delays included):")
        for name, us in total["comm"].most_common(a.top):
            print("%-40s %10.2f %7.1f" % (name, us / 1e3 / per, count["comm"][name] / per))


if __name__ == "__main__":
    main()
