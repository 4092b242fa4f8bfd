// offload/pinned_pool.h — a fixed budget of pinned host memory carved into equal staging
// buffers that are leased and returned, so transfers between tiers never allocate.
//
// The memory is one slab on 2 MiB pages (io/huge_pages.h: explicit huge pages when reserved,
// else transparent huge pages), pinned through the device (Device::pin_host); where the device
// refuses to pin it, the slab comes from Device::alloc_host. memory() is the whole slab, for
// registering with the FileIO that reads into and writes from it (Swapper::register_buffers).
//
// A lease is returned with an optional stream: the buffer becomes free again only when the work
// enqueued on that stream so far has completed (e.g. the device copy reading from it). acquire()
// waits until a buffer is free, at most `timeout_s`: a buffer whose stream never gets there is
// an Error naming the pool and how long it waited, never a hang. The pool is sized once; a
// budget that cannot hold `min_buffers` buffers is an Error at construction (the plan reports it
// earlier, with the numbers). The destructor waits for the last users the same bounded time;
// past it, it logs an error and leaves the memory allocated rather than free bytes a stuck copy
// may still touch.
// Threads: one caller at a time — the engine's thread, or callers that hold a lock of their own
// (the engine's kept compute copies: ForwardCopies in engine/zero_state.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/huge_pages.h"
#include "kernels/device.h"

namespace strata {

class PinnedPool {
 public:
  static constexpr double kDefaultTimeoutS = 600;  // parallel.timeout's default

  // budget_bytes: pinned memory to use (0: exactly min_buffers buffers). timeout_s: how long
  // acquire() and the destructor may wait for a buffer's last stream; in (0, 1e7].
  // pages: what HugePageBuffer tries (best: hugetlb, then thp).
  PinnedPool(Device& device, uint64_t budget_bytes, uint64_t buffer_bytes, int min_buffers,
             std::string what, double timeout_s = kDefaultTimeoutS,
             PageRequest pages = PageRequest::best);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  struct Lease {
    void* data = nullptr;
    int index = -1;
    explicit operator bool() const { return data != nullptr; }
  };
  // A buffer not leased and no longer in use by its last stream; waits for one at most
  // timeout_s. Throws at once when all are leased (a scheduling bug).
  Lease acquire();
  // A buffer not leased and no longer in use by its last stream, or an empty lease when there
  // is none now: never waits, never throws (for optional staging that gives way when busy).
  Lease try_acquire();
  // Free once the work enqueued on `after` so far has completed (now when null).
  void release(Lease lease, Stream* after = nullptr);

  int count() const { return int(slots_.size()); }
  uint64_t buffer_bytes() const { return buffer_bytes_; }
  uint64_t bytes() const { return bytes_; }  // pinned bytes held (the slab, page-rounded)
  // Every staging buffer lies inside this span (count() * buffer_bytes()).
  std::span<std::byte> memory() const { return {base_, slots_.size() * buffer_bytes_}; }
  PageKind pages() const { return pages_; }             // what the slab is on
  const std::string& pages_why() const { return why_; } // why not hugetlb (empty when it is)

 private:
  struct Slot {
    void* data = nullptr;
    bool leased = false;
    std::unique_ptr<Event> done;  // recorded on the last user's stream at release
    bool has_event = false;
  };
  bool in_use(Slot& s);  // its last stream has not passed the release yet
  Lease take(size_t i);  // lease slot i and start the next search after it

  Device& device_;
  uint64_t buffer_bytes_;
  std::string what_;
  double timeout_s_;
  HugePageBuffer slab_;  // pinned with device_.pin_host, or empty when memory_ holds the slab
  Buffer memory_;        // the slab from alloc_host, where pinning slab_ was refused
  std::byte* base_ = nullptr;
  uint64_t bytes_ = 0;
  PageKind pages_ = PageKind::none;
  std::string why_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace strata
