// tests/offload/test_pinned_pool.cpp — PinnedPool on the CPU device: a returned buffer is
// handed out again only once the stream it was returned on has passed the release; a stream
// that never gets there makes acquire() throw after the timeout, naming the pool, and the
// destructor end; leasing more than the pool holds is an immediate Error; the slab is one
// huge-page mapping (or says why not), pinned through the device and unpinned at the end;
// try_acquire gives way at once when every buffer is busy.
#include <chrono>
#include <future>
#include <vector>

#include "core/error.h"
#include "kernels/device.h"
#include "offload/pinned_pool.h"
#include "tests/io/io_test_util.h"

namespace strata {
namespace {

using test::within;
using Clock = std::chrono::steady_clock;

// A stream whose queue is held at a gate until open() (its later work waits behind it).
struct GatedStream {
  explicit GatedStream(Device& dev) : stream(dev.make_stream("gated")) {
    auto f = gate.get_future().share();
    stream->host_task("gate", [f] { f.wait(); });
  }
  ~GatedStream() {
    open();
    stream->synchronize();
  }
  void open() {
    if (!opened) gate.set_value();
    opened = true;
  }
  std::promise<void> gate;
  bool opened = false;
  std::unique_ptr<Stream> stream;
};

TEST(PinnedPool, ABufferReturnedOnAStuckStreamTimesOutNamingThePool) {
  auto dev = make_device(DeviceKind::cpu);
  GatedStream gated(*dev);
  PinnedPool pool(*dev, 0, 4096, 1, "test chunk", 0.25);
  PinnedPool::Lease lease = pool.acquire();
  pool.release(lease, gated.stream.get());
  const auto t0 = Clock::now();
  std::string m;
  within(10, [&] {
    try {
      pool.acquire();
      ADD_FAILURE() << "no Error thrown";
    } catch (const Error& e) {
      m = e.what();
    }
  });
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 5.0);
  EXPECT_NE(m.find("[pinned_pool::acquire] no test chunk staging buffer became free within 0.2"),
            std::string::npos) << m;
  EXPECT_NE(m.find("1 of 1 are returned but still in use"), std::string::npos) << m;
  EXPECT_NE(m.find("raise parallel.timeout (now 0.25 s)"), std::string::npos) << m;
  // Once the stream passes the release, the buffer comes back.
  gated.open();
  PinnedPool::Lease again = within(10, [&] { return pool.acquire(); });
  EXPECT_EQ(again.data, lease.data);
  pool.release(again);
}

TEST(PinnedPool, AcquireTakesAFreeBufferRatherThanWaitForABusyOne) {
  auto dev = make_device(DeviceKind::cpu);
  GatedStream gated(*dev);
  PinnedPool pool(*dev, 0, 4096, 2, "test chunk", 600);
  PinnedPool::Lease a = pool.acquire(), b = pool.acquire();
  pool.release(a, gated.stream.get());  // busy until the gate opens
  pool.release(b);
  PinnedPool::Lease c = within(5, [&] { return pool.acquire(); });
  EXPECT_EQ(c.index, b.index);
  pool.release(c);
  gated.open();  // before the pool's destructor waits for `a`
}

// try_acquire never waits: a buffer leased, or returned on a stream that has not passed the
// release, is passed over; with none free it returns an empty lease at once, and the buffer
// comes back once its stream passes the release.
TEST(PinnedPool, TryAcquireGivesWayWhenEveryBufferIsBusy) {
  auto dev = make_device(DeviceKind::cpu);
  GatedStream gated(*dev);
  PinnedPool pool(*dev, 0, 4096, 2, "test forward", 600);
  PinnedPool::Lease a = pool.try_acquire(), b = pool.try_acquire();
  ASSERT_TRUE(a && b);
  EXPECT_NE(a.index, b.index);
  EXPECT_FALSE(pool.try_acquire()) << "both leased";
  pool.release(a, gated.stream.get());
  const auto t0 = Clock::now();
  EXPECT_FALSE(pool.try_acquire()) << "returned, but its stream has not passed the release";
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
  gated.open();
  gated.stream->synchronize();
  PinnedPool::Lease c = pool.try_acquire();
  ASSERT_TRUE(c);
  EXPECT_EQ(c.index, a.index);
  pool.release(b);
  pool.release(c);
}

TEST(PinnedPool, LeasingMoreThanThePoolHoldsIsAnImmediateError) {
  auto dev = make_device(DeviceKind::cpu);
  PinnedPool pool(*dev, 0, 4096, 2, "test chunk", 600);
  PinnedPool::Lease a = pool.acquire(), b = pool.acquire();
  within(5, [&] {
    try {
      pool.acquire();
      ADD_FAILURE() << "no Error thrown";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("all 2 test chunk staging buffers are leased"),
                std::string::npos) << e.what();
    }
  });
  pool.release(a);
  pool.release(b);
}

TEST(PinnedPool, TheDestructorEndsWhenAStreamIsStuck) {
  auto dev = make_device(DeviceKind::cpu);
  GatedStream gated(*dev);
  auto pool = std::make_unique<PinnedPool>(*dev, 0, 4096, 1, "test chunk", 0.2);
  pool->release(pool->acquire(), gated.stream.get());
  within(10, [&] { pool.reset(); });  // logs, and leaves the memory allocated
}

TEST(PinnedPool, TheSlabIsOneHugePageMappingPinnedThroughTheDevice) {
  auto dev = make_device(DeviceKind::cpu);
  const uint64_t pinned0 = dev->memory().host_pinned_bytes;
  {
    PinnedPool pool(*dev, 0, 1 << 20, 3, "test chunk");
    EXPECT_EQ(pool.memory().size(), 3u << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.memory().data()) % HugePageBuffer::kHugePage, 0u);
    if (pool.pages() != PageKind::hugetlb) {
      EXPECT_NE(pool.pages_why().find("MAP_HUGETLB refused"), std::string::npos) << pool.pages_why();
    }
    if (pool.pages() == PageKind::none) {  // only where transparent huge pages are off
      EXPECT_NE(pool.pages_why().find("transparent huge pages"), std::string::npos) << pool.pages_why();
    }
    EXPECT_EQ(pool.bytes(), 4u << 20) << "the slab is rounded up to whole 2 MiB pages";
    EXPECT_EQ(dev->memory().host_pinned_bytes, pinned0 + pool.bytes());
    std::vector<PinnedPool::Lease> leases;
    for (int i = 0; i < 3; ++i) leases.push_back(pool.acquire());
    for (const auto& l : leases) {
      auto* p = static_cast<std::byte*>(l.data);
      EXPECT_GE(p, pool.memory().data());
      EXPECT_LE(p + pool.buffer_bytes(), pool.memory().data() + pool.memory().size());
    }
    for (auto& l : leases) pool.release(l);
  }
  EXPECT_EQ(dev->memory().host_pinned_bytes, pinned0) << "unpinned at the pool's end";
}

TEST(PinnedPool, FourKilobytePagesWhenAskedFor) {
  auto dev = make_device(DeviceKind::cpu);
  PinnedPool pool(*dev, 0, 8192, 2, "test chunk", PinnedPool::kDefaultTimeoutS, PageRequest::none);
  EXPECT_EQ(pool.pages(), PageKind::none);
  EXPECT_EQ(pool.bytes(), 16384u);
}

TEST(PinnedPool, ATimeoutOutOfRangeIsRefused) {
  auto dev = make_device(DeviceKind::cpu);
  EXPECT_THROW(PinnedPool(*dev, 0, 4096, 1, "test chunk", 0.0), Error);
  EXPECT_THROW(PinnedPool(*dev, 0, 4096, 1, "test chunk", -3.0), Error);
}

}  // namespace
}  // namespace strata
