// offload/pinned_pool.cpp — PinnedPool: equal staging buffers leased round-robin, each freed
// again by an event on its last user's stream.
//
// Waiting polls Event::query() with a growing pause (yields first, then sleeps from 20 µs up to
// 1 ms), because the device seam offers no timed wait on an event; the pause grows only while a
// wait is long, so a buffer that frees within microseconds is taken within microseconds.
#include "offload/pinned_pool.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/size.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

// "0.25", "12.5", "600.0": seconds for messages.
std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.2f" : "%.1f", s);
  return buf;
}

// Keeps pinned memory that a stuck copy may still touch until the process ends: never freed
// (nor unpinned), and reachable from here, so a leak checker does not report what is abandoned
// on purpose.
void abandon(Buffer memory, HugePageBuffer slab) {
  struct Kept {
    std::mutex mu;
    std::vector<Buffer> buffers;
    std::vector<HugePageBuffer> slabs;
  };
  static Kept* kept = new Kept;  // never destroyed: nothing is freed at exit either
  std::lock_guard<std::mutex> lock(kept->mu);
  if (memory) kept->buffers.push_back(std::move(memory));
  if (slab.data()) kept->slabs.push_back(std::move(slab));
}

// Calls ready() until it is true or `timeout_s` has passed; returns whether it became true.
template <class Ready>
bool poll_until(Ready ready, double timeout_s, double* waited_s) {
  const auto t0 = Clock::now();
  const auto deadline =
      t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  auto pause = std::chrono::microseconds(20);
  for (int round = 0;; ++round) {
    if (ready()) return true;
    const auto now = Clock::now();
    *waited_s = std::chrono::duration<double>(now - t0).count();
    if (now >= deadline) return false;
    if (round < 64) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
  }
}

}  // namespace

PinnedPool::PinnedPool(Device& device, uint64_t budget, uint64_t buffer_bytes, int min_buffers,
                       std::string what, double timeout_s, PageRequest pages)
    : device_(device), buffer_bytes_((buffer_bytes + 4095) / 4096 * 4096), what_(std::move(what)),
      timeout_s_(timeout_s) {
  STRATA_CHECK(buffer_bytes_ > 0 && min_buffers >= 1, "pinned_pool::init", "bad pool shape");
  if (!(timeout_s > 0 && timeout_s <= 1e7))  // also refuses NaN
    fail("pinned_pool::init", str("timeout ", timeout_s, " s is out of range"),
         "set parallel.timeout to a number of seconds between 0 and 1e7 (default 600)");
  uint64_t n = budget ? budget / buffer_bytes_ : uint64_t(min_buffers);
  if (n < uint64_t(min_buffers))
    fail("pinned_pool::init",
         str("offload.pinned_mem_limit = ", format_bytes(budget), " holds ", n, " ", what_,
             " staging buffer(s) of ", format_bytes(buffer_bytes_), "; at least ", min_buffers,
             " (", format_bytes(buffer_bytes_ * uint64_t(min_buffers)), ") are needed"),
         "raise offload.pinned_mem_limit (0 sizes it as the plan needs), lower "
         "offload.optimizer_chunk, or shard the model over more ranks");
  slab_ = HugePageBuffer(n * buffer_bytes_, pages);
  pages_ = slab_.pages();
  why_ = slab_.why();
  if (device.pin_host(slab_.data(), slab_.mapped_bytes(), what_)) {
    base_ = slab_.data();
    bytes_ = slab_.mapped_bytes();
  } else {
    slab_ = HugePageBuffer();
    memory_ = device.alloc_host(n * buffer_bytes_, true, what_);
    base_ = memory_.as<std::byte>();
    bytes_ = memory_.bytes();
    // alloc_host asks for transparent huge pages from 2 MiB on (kernels/cpu, kernels/cuda).
    pages_ = n * buffer_bytes_ >= HugePageBuffer::kHugePage ? PageKind::thp : PageKind::none;
    why_ = "the device refused to pin the huge-page slab; it comes from alloc_host";
  }
  log_debug("pinned_pool", what_, ": ", n, " x ", format_bytes(buffer_bytes_), " on ",
            page_kind_name(pages_), " pages", why_.empty() ? "" : " (", why_, why_.empty() ? "" : ")");
  slots_.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    slots_[i].data = base_ + i * buffer_bytes_;
    slots_[i].done = device.make_event();
  }
}

PinnedPool::~PinnedPool() {
  double waited_s = 0;
  size_t busy = 0;
  try {
    bool idle = poll_until(
        [&] {
          busy = 0;
          for (Slot& s : slots_) busy += in_use(s);
          return busy == 0;
        },
        timeout_s_, &waited_s);
    if (idle) {
      if (slab_.data()) device_.unpin_host(slab_.data(), slab_.mapped_bytes());
      return;  // the members free the memory
    }
    log_error("pinned_pool", busy, " ", what_, " staging buffer(s) still in use by device work after ",
              seconds_text(waited_s), " s: leaving ", format_bytes(bytes_),
              " of pinned memory allocated rather than freeing bytes a stuck copy may touch");
  } catch (const std::exception& e) {
    log_error("pinned_pool", "waiting for the ", what_, " staging buffers' last users failed: ",
              e.what(), "; leaving their memory allocated");
  }
  abandon(std::move(memory_), std::move(slab_));
}

bool PinnedPool::in_use(Slot& s) {
  if (s.has_event && s.done->query()) s.has_event = false;
  return s.has_event;
}

PinnedPool::Lease PinnedPool::take(size_t i) {
  slots_[i].leased = true;
  next_ = (i + 1) % slots_.size();
  return Lease{slots_[i].data, int(i)};
}

PinnedPool::Lease PinnedPool::acquire() {
  if (Lease free_now = try_acquire()) return free_now;
  const size_t candidates = size_t(
      std::count_if(slots_.begin(), slots_.end(), [](const Slot& s) { return !s.leased; }));
  if (candidates == 0)
    fail("pinned_pool::acquire", str("all ", slots_.size(), " ", what_, " staging buffers are leased"),
         "this is a scheduling bug: more transfers in flight than the pool was sized for");
  Lease found;
  double waited_s = 0;
  const bool ok = poll_until([&] { return bool(found = try_acquire()); }, timeout_s_, &waited_s);
  if (!ok)
    fail("pinned_pool::acquire",
         str("no ", what_, " staging buffer became free within ", seconds_text(waited_s), " s: ",
             candidates, " of ", slots_.size(), " are returned but still in use by device work "
             "enqueued before their release"),
         str("a device stream stopped making progress (a hung copy or kernel): check the device; "
             "raise parallel.timeout (now ", timeout_s_, " s) if it is only slow"));
  return found;
}

PinnedPool::Lease PinnedPool::try_acquire() {
  // Round-robin from the oldest release, which is the most likely to be free already.
  for (size_t k = 0; k < slots_.size(); ++k) {
    const size_t i = (next_ + k) % slots_.size();
    if (!slots_[i].leased && !in_use(slots_[i])) return take(i);
  }
  return {};
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
