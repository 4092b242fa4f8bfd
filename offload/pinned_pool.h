// offload/pinned_pool.h — a fixed budget of pinned host memory carved into equal staging
// buffers that are leased and returned, so transfers between tiers never allocate.
//
// A lease is returned with an optional stream: the buffer becomes free again only when the work
// enqueued on that stream so far has completed (e.g. the device copy reading from it). acquire() blocks until a buffer is
// free. The pool is sized once; a budget that cannot hold `min_buffers` buffers is an Error at
// construction (the plan reports it earlier, with the numbers).
// Threads: acquire/release from one thread (the engine's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"

namespace strata {

class PinnedPool {
 public:
  // budget_bytes: pinned memory to use (0: exactly min_buffers buffers).
  PinnedPool(Device& device, uint64_t budget_bytes, uint64_t buffer_bytes, int min_buffers,
             std::string what);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  struct Lease {
    void* data = nullptr;
    int index = -1;
    explicit operator bool() const { return data != nullptr; }
  };
  Lease acquire();                               // blocks until one is free
  // Free once the work enqueued on `after` so far has completed (now when null).
  void release(Lease lease, Stream* after = nullptr);

  int count() const { return int(slots_.size()); }
  uint64_t buffer_bytes() const { return buffer_bytes_; }
  uint64_t bytes() const { return memory_.bytes(); }

 private:
  struct Slot {
    void* data = nullptr;
    bool leased = false;
    std::unique_ptr<Event> done;  // recorded on the last user's stream at release
    bool has_event = false;
  };
  Device& device_;
  uint64_t buffer_bytes_;
  Buffer memory_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace strata
