// offload/pinned_pool.h — a fixed budget of pinned host memory carved into equal staging
// buffers that are leased and returned, so transfers between tiers never allocate.
//
// A lease is returned with an optional stream: the buffer becomes free again only when the work
// enqueued on that stream so far has completed (e.g. the device copy reading from it). acquire()
// waits until a buffer is free, at most `timeout_s`: a buffer whose stream never gets there is
// an Error naming the pool and how long it waited, never a hang. The pool is sized once; a
// budget that cannot hold `min_buffers` buffers is an Error at construction (the plan reports it
// earlier, with the numbers). The destructor waits for the last users the same bounded time;
// past it, it logs an error and leaves the memory allocated rather than free bytes a stuck copy
// may still touch.
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
  static constexpr double kDefaultTimeoutS = 600;  // parallel.timeout's default

  // budget_bytes: pinned memory to use (0: exactly min_buffers buffers). timeout_s: how long
  // acquire() and the destructor may wait for a buffer's last stream; in (0, 1e7].
  PinnedPool(Device& device, uint64_t budget_bytes, uint64_t buffer_bytes, int min_buffers,
             std::string what, double timeout_s = kDefaultTimeoutS);
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
  bool in_use(Slot& s);  // its last stream has not passed the release yet

  Device& device_;
  uint64_t buffer_bytes_;
  std::string what_;
  double timeout_s_;
  Buffer memory_;
  std::vector<Slot> slots_;
  size_t next_ = 0;
};

}  // namespace strata
