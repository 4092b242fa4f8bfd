// bench/io_bench.h — `strata bench io`: sequential write, then read, of a striped swap space
// through FileIO (O_DIRECT where the file system allows it, so the page cache cannot serve the
// reads), with every block read back checked; and a sweep over block sizes and queue depths
// that recommends io.block_size and io.queue_depth.
// With `update`, an update pass runs between the write and the read: every block read, checked
// and written back in place, stamped anew — the optimizer's traffic over its states on NVMe,
// whose rate some disks give only while the space is small (a VM host's cache of its disk).
// With `overwrite`, a write pass that is not timed lays the blocks out first, so the timed write
// overwrites blocks already written: the engine's swap after its first step. On ext4 a first
// write into a fresh (fallocated, unwritten) extent also converts it, and on one virtio disk
// that made it half as fast as an overwrite (fio: 1.7-2.4 against 4.1-4.4 GB/s).
//
// Figures are decimal GB/s (1e9 bytes per second, as fio prints "GB/s"), over the whole phase
// from the first submission to the last completion. `wrong` counts 4 KiB sectors read back with
// bytes other than those written (each sector carries its offset and the run's seed).
// Staging memory is allocated and registered as the engine's pinned pool does it: one
// HugePageBuffer, registered once with FileIO::register_buffers; "buffers" in the JSON says
// which pages it got and whether the buffers and the files were registered.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/file_io.h"  // kDefaultSubmitBatch

namespace strata {

struct IoBenchOptions {
  std::vector<std::string> dirs;       // one file per directory, striped
  uint64_t size_bytes = 4ull << 30;    // written, then read
  uint64_t block_bytes = 1ull << 20;   // bytes per request
  int queue_depth = 32;                // requests in flight
  int submit_batch = kDefaultSubmitBatch;  // io_uring: requests per io_uring_enter
  std::string backend = "auto";        // auto | uring | posix
  uint64_t stripe_bytes = 1ull << 20;  // across dirs
  double max_seconds = 0;              // per phase; 0 = no limit (the sweep sets one)
  // Staging pages, as the engine's pinned pool gets them (io/huge_pages.h): "auto" (hugetlb,
  // else transparent huge pages, else 4K), "thp" (skip hugetlb) or "none" (4K pages).
  std::string pages = "auto";
  bool register_buffers = true;        // register the staging memory with io_uring (fixed buffers)
  bool update = false;                 // the update pass between the write and the read
  bool overwrite = false;              // an untimed write pass first: the timed one overwrites
  // Tests only: flips one byte of this block's buffer after the read pass reads it back (not the
  // update pass), before its check (the check must count that sector wrong). UINT64_MAX: none.
  uint64_t test_corrupt_block = UINT64_MAX;
  uint64_t test_corrupt_byte = 0;      // offset of the flipped byte within the block
};

// One write + read pass (write + update + read with `update`). Throws strata::Error on I/O
// errors; a non-zero `wrong` is reported, not thrown (the caller decides).
nlohmann::json run_io_bench(const IoBenchOptions& options);

struct IoSweepOptions {
  IoBenchOptions base;  // dirs, backend, stripe; size_bytes is the cap per point
  std::vector<uint64_t> blocks = {128ull << 10, 256ull << 10, 512ull << 10, 1ull << 20,
                                  2ull << 20, 4ull << 20, 8ull << 20};
  std::vector<int> depths = {1, 2, 4, 8, 16, 32, 64};
  double seconds_per_phase = 2.0;
};

// Every (block, depth) point, the best, and the recommendation. Points are scored by the
// harmonic mean of write and read GB/s (the rate of moving equal bytes each way). A block size
// qualifies from the smallest depth at which it and every deeper point score within 10% of the
// best (the median of the five best, so one lucky sample does not decide); the recommendation
// is the qualifying point with the least staging memory (block × depth).
nlohmann::json run_io_sweep(const IoSweepOptions& options);
std::string format_io_bench(const nlohmann::json& result);  // human-readable, either kind

}  // namespace strata
