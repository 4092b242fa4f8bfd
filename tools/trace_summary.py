#!/usr/bin/env python3
"""tools/trace_summary.py — what a strata Chrome trace (log.trace) says about overlap.

For each track (stream, I/O queue, the optimizer's worker thread, the passes' waits for its
updates): the time it was busy and the time it spent blocked in "wait" spans (a stream waiting
for another, a pass waiting for an overlapped optimizer update), as a share of the traced wall
time. Spans of one track may overlap (several NVMe jobs in flight): each time is the union of
its spans, so no share exceeds 100 %.
Usage: tools/trace_summary.py TRACE.json [TRACE.rank1 ...]   (standard library only)
"""
import json
import sys


def union_us(spans):
    """Length of the union of [ts, ts + dur) over spans, in microseconds."""
    total, end = 0, None
    for e in sorted(spans, key=lambda e: e["ts"]):
        a, b = e["ts"], e["ts"] + e["dur"]
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


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
        busy = union_us([e for e in mine if e["name"] != "wait"])
        waited = union_us([e for e in mine if e["name"] == "wait"])
        print(f"  {name:12s} busy {busy / 1000:9.1f} ms ({100 * busy / wall:5.1f}%)  "
              f"blocked in wait {waited / 1000:9.1f} ms ({100 * waited / wall:5.1f}%)")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for p in sys.argv[1:]:
        summarize(p)
