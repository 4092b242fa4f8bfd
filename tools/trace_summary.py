#!/usr/bin/env python3
"""tools/trace_summary.py — what a strata Chrome trace (log.trace) says about overlap.

For each track (stream, I/O queue, the optimizer's worker thread, the passes' waits for its
updates): the time it was busy and the time it spent blocked in "wait" spans (a stream waiting
for another, a pass waiting for an overlapped optimizer update), as a share of the traced wall
time. Spans of one track may overlap (several NVMe jobs in flight): each time is the union of
its spans, so no share exceeds 100 %.

With --disk [SECONDS], also what the NVMe tier moved and when (each job's span carries its bytes):
the bytes read and written, the disk's rate in bins of SECONDS (1 by default; a job's bytes are
spread evenly over its span), the bins where requests were in flight but the disk moved less than
a quarter of its median busy rate (stalls), and for each optimizer update the bytes of the jobs
that ended inside it, their rate, and the shares of its time with reads and writes both in flight,
reads only, writes only, and neither (an update whose disk runs one way at a time, or idles,
does not keep the disk at its mixed rate).
Usage: tools/trace_summary.py [--disk [SECONDS]] TRACE.json [TRACE.rank1 ...]
(standard library only)
"""
import json
import statistics
import sys


def merged(intervals):
    """The union of [a, b) intervals as disjoint sorted intervals."""
    out = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def intersect(a, b):
    """The intersection of two sorted lists of disjoint [a, b) intervals."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            out.append([lo, hi])
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def length(intervals):
    return sum(b - a for a, b in intervals)


def within(intervals, a, b):
    """The parts of sorted disjoint intervals inside [a, b)."""
    return [[max(x, a), min(y, b)] for x, y in intervals if y > a and x < b]


def union_us(spans):
    """Length of the union of [ts, ts + dur) over spans, in microseconds."""
    return sum(b - a for a, b in merged((e["ts"], e["ts"] + e["dur"]) for e in spans))


def disk(events, names, t0, t1, bin_s):
    """The NVMe tier's traffic: totals, a timeline in bins, stalls, and per optimizer update."""
    jobs = [e for e in events if e.get("ph") == "X" and names.get(e["tid"]) in ("nvme read", "nvme write")]
    if not jobs:
        print("  disk: no NVMe jobs in this trace")
        return
    if any("bytes" not in e.get("args", {}) for e in jobs):
        print("  disk: the NVMe spans carry no byte counts (a trace from before they did)")
        return
    is_read = lambda e: names[e["tid"]] == "nvme read"
    rd = sum(e["args"]["bytes"] for e in jobs if is_read(e))
    wr = sum(e["args"]["bytes"] for e in jobs if not is_read(e))
    print(f"  disk: read {rd / 1e9:.2f} GB, written {wr / 1e9:.2f} GB in {len(jobs)} jobs; "
          f"requests in flight {union_us(jobs) / 1e6:.1f} s of {(t1 - t0) / 1e6:.1f} s")
    width = bin_s * 1e6
    n = int((t1 - t0) // width) + 1
    moved = [[0.0, 0.0] for _ in range(n)]  # read, written per bin
    busy = [0.0] * n                         # microseconds with a job in flight, per bin
    for e in jobs:
        a, b = e["ts"] - t0, e["ts"] - t0 + e["dur"]
        for i in range(int(a // width), min(int(b // width), n - 1) + 1):
            lo, hi = max(a, i * width), min(b, (i + 1) * width)
            if hi > lo or a == b:
                moved[i][0 if is_read(e) else 1] += e["args"]["bytes"] * ((hi - lo) / (b - a) if b > a else 1)
    for a, b in merged([(e["ts"] - t0, e["ts"] - t0 + e["dur"]) for e in jobs]):
        for i in range(int(a // width), min(int(b // width), n - 1) + 1):
            busy[i] += max(0.0, min(b, (i + 1) * width) - max(a, i * width))
    rate = [(r + w) / 1e9 / bin_s for r, w in moved]
    full = [rate[i] for i in range(n) if busy[i] >= 0.9 * width]
    print(f"  disk rate in {bin_s:g} s bins, GB/s read+write (start s: rate; '.' = no request in flight):")
    cells = [f"{i * bin_s:g}:{rate[i]:.1f}" if busy[i] > 0 else f"{i * bin_s:g}:." for i in range(n)]
    for k in range(0, n, 10):
        print("    " + " ".join(f"{c:>9s}" for c in cells[k:k + 10]))
    if full:
        med = statistics.median(full)
        slow = [i for i in range(n) if busy[i] >= 0.9 * width and rate[i] < med / 4]
        print(f"  disk: median rate of the bins busy throughout {med:.2f} GB/s; below a quarter of it "
              f"(stalls): {len(slow)} bin(s)" + (" at " + ", ".join(f"{i * bin_s:g} s" for i in slow[:20])
                                                 + (" ..." if len(slow) > 20 else "") if slow else ""))
    updates = [e for e in events if e.get("ph") == "X"
               and names.get(e["tid"], "").startswith("optimizer")  # and "optimizer in memory"
               and e["name"].startswith("update ")]
    if updates:
        reads = merged((e["ts"], e["ts"] + e["dur"]) for e in jobs if is_read(e))
        writes = merged((e["ts"], e["ts"] + e["dur"]) for e in jobs if not is_read(e))
        print("  optimizer updates: NVMe bytes of the jobs that ended inside each, their rate, and the")
        print("  shares of the update's time with reads and writes in flight (both / read / write / none)")
        for u in sorted(updates, key=lambda e: e["ts"]):
            a, b = u["ts"], u["ts"] + u["dur"]
            inside = [e for e in jobs if a <= e["ts"] + e["dur"] <= b]
            r = sum(e["args"]["bytes"] for e in inside if is_read(e))
            w = sum(e["args"]["bytes"] for e in inside if not is_read(e))
            gbps = (r + w) / 1e9 / (u["dur"] / 1e6) if u["dur"] > 0 else 0.0
            rd, wr = within(reads, a, b), within(writes, a, b)
            both = length(intersect(rd, wr))
            shares = [both, length(rd) - both, length(wr) - both]
            shares.append(u["dur"] - sum(shares))
            pct = " / ".join(f"{100 * x / u['dur']:3.0f}" if u["dur"] > 0 else "  -" for x in shares)
            print(f"    {u['name'][7:]:16s} at {(a - t0) / 1e6:8.2f} s  {u['dur'] / 1e3:8.1f} ms  "
                  f"read {r / 1e9:6.3f} GB  written {w / 1e9:6.3f} GB  {gbps:5.2f} GB/s  {pct} %")


def summarize(path, bin_s=None):
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
    if bin_s:
        disk(events, names, t0, t1, bin_s)


if __name__ == "__main__":
    args, bin_s = sys.argv[1:], None
    if args and args[0] == "--disk":
        args, bin_s = args[1:], 1.0
        try:  # an optional bin width; anything else is the first trace (TRACE.json.rank1 too)
            bin_s = float(args[0]) if args else bin_s
            args = args[1:]
        except ValueError:
            pass
        if bin_s <= 0:
            sys.exit(f"trace_summary: the --disk bin width must be positive, not {bin_s:g}")
    if not args:
        sys.exit(__doc__)
    for p in args:
        summarize(p, bin_s)
