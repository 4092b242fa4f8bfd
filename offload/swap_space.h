// offload/swap_space.h — the NVMe tier's storage: one preallocated file per directory of
// offload.nvme_path, striped into one logical space, and an extent map from a state's stable key
// ("unit3/optimizer/m") to its bytes there.
//
// Before anything is created it checks that every file system holds its share (statvfs), and
// refuses with the bytes needed and available. The files are unlinked as soon as they are open,
// so they vanish when the process ends, normally, on an error, or killed; they are visible only
// under /proc/<pid>/fd meanwhile. It does not move data by itself beyond the synchronous helpers,
// does not compact, and does not persist: checkpoints are written elsewhere.
//
// Threads: like the FileIO it uses, one thread at a time. The FileIO must outlive the SwapSpace.
//
// Example:
//   auto io = make_file_io(IoOptions{}, dirs);
//   SwapSpace swap(*io, {.dirs = dirs, .capacity_bytes = 8 * GiB});
//   swap.allocate("unit0/optimizer/m", bytes);
//   io->submit(swap.request(IoOp::write, "unit0/optimizer/m", pinned, bytes));  // async
//   ...
//   swap.read("unit0/optimizer/m", pinned, bytes);  // synchronous: submit + drain
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/file_io.h"

namespace strata {

struct SwapSpaceOptions {
  std::vector<std::string> dirs;       // one per NVMe device (offload.nvme_path)
  uint64_t capacity_bytes = 0;         // the logical space, across all directories
  uint64_t stripe_bytes = 1ull << 20;  // io.stripe_size
  std::string name = "swap";           // files are <dir>/strata-<pid>-<name>-<i>.swap
};

// The logical capacity a SwapSpace over `dirs` directories needs for `extents` extents of
// `bytes` in all: each extent may lose up to one alignment to rounding — a stripe where several
// directories stripe the space, else 1 MiB (the granule, max(4096, the files' direct-I/O
// alignment), is far less). The engine sizes its swap space so, and `strata plan` checks it.
uint64_t swap_capacity(uint64_t bytes, uint64_t extents, size_t dirs, uint64_t stripe_bytes);
// The bytes each directory's file takes for `capacity`: whole stripes when several, else the
// capacity rounded up to 4 KiB.
uint64_t swap_file_share(uint64_t capacity, size_t dirs, uint64_t stripe_bytes);

// One file system under offload.nvme_path's folders, as their swap files see it: folders on one
// disk, or a symlink to one, share its free space.
struct SwapFileSystem {
  std::string dirs;         // its folders, quoted, comma-separated
  size_t files = 0;         // swap files it holds: one per folder
  uint64_t free_bytes = 0;  // statvfs: f_bavail x f_frsize; 0 with a problem
  std::string problem;      // why no swap file can be made there; empty when one can
  bool in_memory = false;   // tmpfs or ramfs (/dev/shm): its files take RAM, not disk
};
// `dirs` grouped by file system (st_dev), in their order. A folder not made yet is looked up at
// its nearest existing ancestor (training creates it). A folder where no file can be made (not a
// folder, read-only, not on a disk such as /proc, not writable, a path that cannot be looked up)
// is an entry of its own with its problem. The engine refuses such a folder and checks each file
// system's share before creating anything; `strata plan` checks the same, and counts the files
// on a file system in memory (tmpfs) against RAM as well.
std::vector<SwapFileSystem> swap_file_systems(const std::vector<std::string>& dirs);

struct SwapExtent {
  uint64_t offset = 0;  // in the logical space
  uint64_t bytes = 0;   // as allocated (rounded up to the granule)
};

class SwapSpace {
 public:
  SwapSpace(FileIO& io, SwapSpaceOptions options);
  ~SwapSpace();  // drains the FileIO, closes the file; errors are logged, never thrown
  SwapSpace(const SwapSpace&) = delete;
  SwapSpace& operator=(const SwapSpace&) = delete;

  // Reserves `bytes` (rounded up to granule()) for `key`; extents of at least one stripe start
  // on a stripe boundary so that their chunks are whole. Throws if the key exists or nothing fits.
  const SwapExtent& allocate(const std::string& key, uint64_t bytes);
  void release(const std::string& key);
  bool contains(const std::string& key) const { return extents_.count(key) != 0; }
  const SwapExtent& extent(const std::string& key) const;  // throws naming the key
  const std::map<std::string, SwapExtent>& extents() const { return extents_; }

  // The request moving `length` bytes at `offset` within key's extent (bounds checked).
  IoRequest request(IoOp op, const std::string& key, void* buffer, uint64_t length,
                    uint64_t offset = 0, uint64_t tag = 0) const;
  // Synchronous helpers (submit + drain): for callers with nothing else pending on the FileIO.
  void write(const std::string& key, const void* buffer, uint64_t length, uint64_t offset = 0);
  void read(const std::string& key, void* buffer, uint64_t length, uint64_t offset = 0);

  FileIO& io() const { return io_; }
  int file() const { return file_; }  // the striped file in io()
  uint64_t capacity_bytes() const { return capacity_; }
  uint64_t used_bytes() const { return used_; }
  uint64_t granule() const { return granule_; }
  const std::vector<std::string>& paths() const { return paths_; }  // unlinked once open

 private:
  FileIO& io_;
  SwapSpaceOptions options_;
  std::vector<std::string> paths_;
  int file_ = -1;
  uint64_t capacity_ = 0, used_ = 0, granule_ = 4096;
  std::map<std::string, SwapExtent> extents_;
  std::map<uint64_t, uint64_t> free_;  // offset → bytes, coalesced
};

}  // namespace strata
