#!/usr/bin/env python3
"""bench/peers/deepnvme.py — DeepSpeed's DeepNVMe (its async_io op) with the parameters of
`strata bench io`, as a peer: one file in --dir, preallocated like strata's swap space and fio's
file, written sequentially and then read back with the op's aio_handle(block_size, queue_depth,
single_submit, overlap_events, intra_op_parallelism) through a page-locked buffer from the handle
itself (new_cpu_locked_tensor: posix_memalign + mlock, as DeepSpeed uses without a GPU).

The file moves in --buffer pieces (default 1G), each one sync_pwrite / sync_pread of the whole
buffer: the handle cuts it into block_size requests and keeps queue_depth of them in flight per
thread, as DeepSpeed's own swapper and ds_io benchmark do. Every 4 KiB sector carries its file
offset and the run's seed, and every sector read back is checked (outside the timed part: the
reads are synchronous, so a check would only add to their time); `wrong` counts sectors that
differ, and the script fails when any does. Prints decimal GB/s (1e9 B/s), like strata and fio.

With --overwrite the file is written once before the timed write (not timed), so that the timed
write overwrites blocks already written, like `strata bench io --pattern overwrite`.

Where the op cannot be loaded it prints exactly why (deepspeed or torch not installed, libaio
missing, the op failing to build) and exits 2, with --json as {"peer": "deepnvme", "error": ...}.

  bench/peers/deepnvme.py --dir DIR [--size 4G] [--block 1M] [--qd 32] [--buffer 1G]
                          [--threads 1] [--single-submit] [--overlap-events] [--overwrite]
                          [--json]
"""
import argparse
import json
import os
import re
import sys
import time

SECTOR = 4096


def parse_bytes(text):
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (e.g. 4G, 1M, 512K)")
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def load_op():
    """The async_io module, or raises RuntimeError saying why it cannot be had."""
    try:
        import torch  # noqa: F401
    except ImportError as e:
        raise RuntimeError(f"torch is not installed ({e}); DeepNVMe needs it: "
                           "python3 -m pip install torch deepspeed")
    try:
        import deepspeed  # noqa: F401
        from deepspeed.ops.op_builder import AsyncIOBuilder
    except ImportError as e:
        raise RuntimeError(f"deepspeed is not installed ({e}): python3 -m pip install deepspeed")
    builder = AsyncIOBuilder()
    if not builder.is_compatible(verbose=False):
        raise RuntimeError("DeepSpeed's async_io op is not compatible with this machine: it needs "
                           "libaio's headers and library (apt-get install -y libaio-dev) and a C++ "
                           "compiler to build the op")
    try:
        return builder.load(verbose=False)
    except Exception as e:  # the JIT build's own error: compiler output, missing headers...
        raise RuntimeError(f"building or loading DeepSpeed's async_io op failed: {e}")


def anon_huge_bytes(address, length):
    """AnonHugePages of the mappings overlapping [address, address + length) (/proc/self/smaps)."""
    total, overlap = 0, 0
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(" ", 1)[0]
                if "-" in head and all(c in "0123456789abcdef-" for c in head):
                    lo, hi = (int(x, 16) for x in head.split("-"))
                    overlap = max(0, min(hi, address + length) - max(lo, address))
                elif overlap and line.startswith("AnonHugePages:"):
                    total += min(int(line.split()[1]) * 1024, overlap)
    except OSError:
        return None
    return min(total, length)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", required=True, help="directory for the file (the same as strata's)")
    ap.add_argument("--size", type=parse_bytes, default=parse_bytes("4G"))
    ap.add_argument("--block", type=parse_bytes, default=parse_bytes("1M"), help="aio block_size")
    ap.add_argument("--qd", type=int, default=32, help="aio queue_depth")
    ap.add_argument("--buffer", type=parse_bytes, default=parse_bytes("1G"),
                    help="bytes per sync_pwrite / sync_pread call (capped at --size)")
    ap.add_argument("--threads", type=int, default=1, help="intra_op_parallelism")
    ap.add_argument("--single-submit", action="store_true")
    ap.add_argument("--overlap-events", action="store_true")
    ap.add_argument("--overwrite", action="store_true",
                    help="write the file once untimed first: the timed write overwrites")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    a = ap.parse_args()
    out = sys.stdout
    if a.json:  # the JSON alone on stdout: DeepSpeed's logger and its C++ op print there too
        out = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
        sys.stdout = sys.stderr

    def refuse(why):
        if a.json:
            print(json.dumps({"peer": "deepnvme", "error": why}, separators=(",", ":")), file=out, flush=True)
        else:
            print(f"deepnvme.py: {why}", file=sys.stderr)
        sys.exit(2)

    if not os.path.isdir(a.dir):
        refuse(f"'{a.dir}' is not a directory")
    if a.block % SECTOR or a.block <= 0:
        refuse(f"block size {a.block} is not a multiple of 4096")
    buffer_bytes = min(a.buffer, a.size) // a.block * a.block
    if buffer_bytes == 0 or buffer_bytes % (SECTOR * a.threads):
        refuse(f"buffer {buffer_bytes} must hold whole blocks and split evenly over {a.threads} thread(s)")
    size = a.size // buffer_bytes * buffer_bytes
    try:
        op = load_op()
    except RuntimeError as e:
        refuse(str(e))
    import deepspeed
    import torch

    handle = op.aio_handle(a.block, a.qd, a.single_submit, a.overlap_events, a.threads)
    buf = handle.new_cpu_locked_tensor(buffer_bytes, torch.empty(0, dtype=torch.uint8))
    if buf.numel() != buffer_bytes:
        refuse(f"new_cpu_locked_tensor gave {buf.numel()} bytes, not {buffer_bytes}")
    words = buf.view(torch.int64).view(-1, SECTOR // 8)  # (sectors, 512)
    seed = int.from_bytes(os.urandom(8), "little") >> 1
    gen = torch.Generator().manual_seed(seed)
    page = torch.randint(-(1 << 62), 1 << 62, (SECTOR // 8,), dtype=torch.int64, generator=gen)
    words.copy_(page.expand_as(words))
    words[:, 1] = seed
    sector_offsets = torch.arange(words.shape[0], dtype=torch.int64) * SECTOR
    huge = anon_huge_bytes(buf.data_ptr(), buffer_bytes)

    path = os.path.join(a.dir, f"strata-deepnvme-{os.getpid()}.bin")
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # as strata's swap space and fio lay out their files
        finally:
            os.close(fd)

        def write_all():
            for off in range(0, size, buffer_bytes):
                words[:, 0] = sector_offsets + off
                n = handle.sync_pwrite(buf, path, off)
                if n < 0:
                    raise RuntimeError(f"sync_pwrite of {buffer_bytes} bytes at {off} in {path} "
                                       f"returned {n}")

        if a.overwrite:
            write_all()  # not timed: lays the blocks out
        t0 = time.perf_counter()
        write_all()
        write_s = time.perf_counter() - t0

        wrong, read_s = 0, 0.0
        for off in range(0, size, buffer_bytes):
            words.zero_()
            t0 = time.perf_counter()
            n = handle.sync_pread(buf, path, off)
            read_s += time.perf_counter() - t0
            if n < 0:
                raise RuntimeError(f"sync_pread of {buffer_bytes} bytes at {off} in {path} returned {n}")
            bad = (words[:, 0] != sector_offsets + off) | (words[:, 1] != seed) | \
                  (words[:, 2:] != page[2:]).any(dim=1)
            wrong += int(bad.sum())
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    handle.free_cpu_locked_tensor(buf)

    r = {
        "peer": "deepnvme",
        "deepspeed_version": deepspeed.__version__,
        "write_gbps": round(size / write_s / 1e9, 3),
        "read_gbps": round(size / read_s / 1e9, 3),
        "size_bytes": size,
        "block_bytes": a.block,
        "overwrite": a.overwrite,
        "queue_depth": a.qd,
        "buffer_bytes": buffer_bytes,
        "intra_op_parallelism": a.threads,
        "single_submit": a.single_submit,
        "overlap_events": a.overlap_events,
        "buffer_memory": "page-locked (new_cpu_locked_tensor: posix_memalign + mlock)",
        "buffer_huge_bytes": huge,
        "wrong": wrong,
    }
    if a.json:
        print(json.dumps(r, separators=(",", ":")), file=out, flush=True)
    else:
        print(f"deepnvme (deepspeed {r['deepspeed_version']} async_io): block {a.block}, queue depth "
              f"{a.qd}, {a.threads} thread(s), single_submit {a.single_submit}, overlap_events "
              f"{a.overlap_events}, {size} bytes in {buffer_bytes}-byte calls; buffer page-locked, "
              f"{huge if huge is not None else '?'} bytes of it on huge pages")
        print(f"  write {r['write_gbps']:.3f} GB/s")
        print(f"  read  {r['read_gbps']:.3f} GB/s")
        print(f"  wrong sectors: {wrong}")
    if wrong:
        print(f"deepnvme.py: {wrong} sectors of 4K read back differ from what was written",
              file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
