// offload/pinned_pool.cpp — PinnedPool.
#include "offload/pinned_pool.h"

#include "core/error.h"
#include "core/size.h"

namespace strata {

PinnedPool::PinnedPool(Device& device, uint64_t budget, uint64_t buffer_bytes, int min_buffers,
                       std::string what)
    : device_(device), buffer_bytes_((buffer_bytes + 4095) / 4096 * 4096) {
  STRATA_CHECK(buffer_bytes_ > 0 && min_buffers >= 1, "pinned_pool::init", "bad pool shape");
  uint64_t n = budget ? budget / buffer_bytes_ : uint64_t(min_buffers);
  if (n < uint64_t(min_buffers))
    fail("pinned_pool::init",
         str("offload.pinned_mem_limit = ", format_bytes(budget), " holds ", n, " ", what,
             " staging buffer(s) of ", format_bytes(buffer_bytes_), "; at least ", min_buffers,
             " (", format_bytes(buffer_bytes_ * uint64_t(min_buffers)), ") are needed"),
         "raise offload.pinned_mem_limit (0 sizes it as the plan needs), lower "
         "offload.optimizer_chunk, or shard the model over more ranks");
  memory_ = device.alloc_host(n * buffer_bytes_, true, what);
  slots_.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    slots_[i].data = memory_.as<std::byte>() + i * buffer_bytes_;
    slots_[i].done = device.make_event();
  }
}

PinnedPool::~PinnedPool() {
  for (auto& s : slots_)
    if (s.has_event) s.done->synchronize();
}

PinnedPool::Lease PinnedPool::acquire() {
  // Round-robin: the oldest released buffer is the most likely to be free already.
  for (size_t tries = 0; tries < slots_.size(); ++tries) {
    Slot& s = slots_[next_];
    size_t i = next_;
    next_ = (next_ + 1) % slots_.size();
    if (s.leased) continue;
    if (s.has_event) {
      s.done->synchronize();
      s.has_event = false;
    }
    s.leased = true;
    return Lease{s.data, int(i)};
  }
  fail("pinned_pool::acquire", str("all ", slots_.size(), " staging buffers are leased"),
       "this is a scheduling bug: more transfers in flight than the pool was sized for");
}

void PinnedPool::release(Lease lease, Stream* after) {
  if (!lease) return;
  Slot& s = slots_.at(size_t(lease.index));
  STRATA_CHECK(s.leased, "pinned_pool::release", "buffer ", lease.index, " was not leased");
  s.leased = false;
  s.has_event = after != nullptr;
  if (after) after->record(*s.done);
}

}  // namespace strata
