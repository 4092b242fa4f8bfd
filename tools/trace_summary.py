#!/usr/bin/env python3
"""tools/trace_summary.py — what a strata Chrome trace (log.trace) says about overlap.

For each track (stream or I/O queue): busy time, and for the compute track the time it spent
blocked in "wait" spans (waiting for communication), as a share of the traced wall time.
Usage: tools/trace_summary.py TRACE.json [TRACE.rank1 ...]   (standard library only)
"""
import json
import sys


def summarize(path):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e.get("ph") == "M"}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        print(f"{path}: no spans")
        return
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    wall = t1 - t0
    print(f"{path}: {len(spans)} spans over {wall / 1000:.1f} ms")
    for tid, name in sorted(names.items(), key=lambda kv: kv[1]):
        mine = [e for e in spans if e["tid"] == tid]
        busy = sum(e["dur"] for e in mine if e["name"] != "wait")
        waited = sum(e["dur"] for e in mine if e["name"] == "wait")
        print(f"  {name:12s} busy {busy / 1000:9.1f} ms ({100 * busy / wall:5.1f}%)  "
              f"blocked in wait {waited / 1000:9.1f} ms ({100 * waited / wall:5.1f}%)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        summarize(p)
