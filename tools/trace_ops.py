"""Sums a `strata run --trace` file's op events by op type: the time each
type took over the run, its count and its share, largest first. On a GPU the
trace waits for each op's kernels, so these are device times.

  python3 tools/trace_ops.py TRACE.json [--top N]
"""

import argparse
import collections
import json
import sys


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        sys.exit("trace_ops: %s: %s" % (a.trace, e))
    total = collections.Counter()
    count = collections.Counter()
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("op", "comm"):
            total[e["name"]] += e["dur"]
            count[e["name"]] += 1
    whole = sum(total.values())
    if whole == 0:
        sys.exit("trace_ops: %s holds no op events" % a.trace)
    print("%-40s %10s %7s %6s" % ("op", "ms", "count", "share"))
    for name, us in total.most_common(a.top):
        print("%-40s %10.2f %7d %5.1f%%" % (name, us / 1e3, count[name], 100.0 * us / whole))
    print("%-40s %10.2f %7d" % ("all ops", whole / 1e3, sum(count.values())))


if __name__ == "__main__":
    main()
