// The CUDA device against the contract of kernels/device.h: stream order (host tasks included),
// events across streams (an event never recorded is complete; waits refer to the latest record),
// errors of host tasks and of launches rethrown by synchronize() and then cleared, the memory cap
// and its message, pinned host memory (4096-aligned, counted, usable for copies), copies between
// every kind of memory, and misuse across device kinds. Ordering tests hold the producer at a
// gate the test opens, so they cannot pass by luck of timing. Skipped without a CUDA device.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/size.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "tests/gpu/gpu_test_util.h"

namespace strata {
namespace {

using test::Gpu;

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CudaDevice, DescribesItselfAndItsBuild) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  EXPECT_TRUE(cuda_built());
  EXPECT_EQ(g.dev->kind(), DeviceKind::cuda);
  EXPECT_NE(g.dev->name().find("cuda:0"), std::string::npos) << g.dev->name();
  const std::string d = cuda_describe();
  EXPECT_NE(d.find("compute capability"), std::string::npos) << d;
  EXPECT_NE(d.find("built for CUDA architectures"), std::string::npos) << d;
  EXPECT_GT(g.dev->memory().limit_bytes, 0u);
}

TEST(CudaDevice, RejectsAMissingOrdinal) {
  STRATA_REQUIRE_CUDA();
  DeviceOptions o;
  o.ordinal = cuda_device_count();
  const std::string msg = error_of([&] { make_device(DeviceKind::cuda, o); });
  EXPECT_NE(msg.find("does not exist"), std::string::npos) << msg;
}

// ---- streams and events ---------------------------------------------------------------------

TEST(CudaDevice, StreamRunsHostTasksCopiesAndFillsInOrder) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const size_t n = 1 << 16;
  Buffer src = g.dev->alloc_host(n * 4, true, "src"), dst = g.dev->alloc_host(n * 4, true, "dst");
  Buffer dev = g.dev->alloc(n * 4, "dev"), zeros = g.dev->alloc_host(n * 4, true, "zeros");
  std::fill_n(dst.as<float>(), n, -1.0f);
  std::fill_n(zeros.as<float>(), n, -1.0f);
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  std::vector<int> seen;  // touched only by the stream's host tasks until synchronize
  g.s->host_task("wait for the test", [opened] { opened.wait(); });
  for (int i = 0; i < 50; ++i) g.s->host_task("append", [&seen, i] { seen.push_back(i); });
  // Written by a host task, then copied: the copy must see what the task wrote.
  float* s = src.as<float>();
  g.s->host_task("produce", [s, n] { std::iota(s, s + n, 0.0f); });
  g.s->copy(dev.data(), src.data(), n * 4);
  g.s->copy(dst.data(), dev.data(), n * 4);
  g.s->fill_zero(dev.data(), n * 4);
  g.s->copy(zeros.data(), dev.data(), n * 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dst.as<float>()[n - 1], -1.0f) << "the copies ran before the gate opened";
  gate.set_value();
  g.s->synchronize();
  ASSERT_EQ(seen.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(seen[i], i);
  for (size_t i = 0; i < n; i += 997) {
    EXPECT_EQ(dst.as<float>()[i], float(i));
    EXPECT_EQ(zeros.as<float>()[i], 0.0f);
  }
}

TEST(CudaDevice, EventOrdersConsumerAfterProducer) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  auto producer = g.dev->make_stream("producer"), consumer = g.dev->make_stream("consumer");
  auto ready = g.dev->make_event();
  EXPECT_TRUE(ready->query()) << "an event never recorded is complete";
  ready->synchronize();  // returns at once
  consumer->wait(*ready);
  consumer->synchronize();  // waiting on a never-recorded event does not block

  const size_t n = 1 << 20;
  Buffer src = g.dev->alloc_host(n * 4, true, "src"), dst = g.dev->alloc_host(n * 4, true, "dst");
  Buffer dev = g.dev->alloc(n * 4, "dev");
  std::fill_n(src.as<float>(), n, 42.0f);
  std::fill_n(dst.as<float>(), n, 0.0f);
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  producer->host_task("gate", [opened] { opened.wait(); });
  producer->copy(dev.data(), src.data(), n * 4);
  producer->record(*ready);
  consumer->wait(*ready);
  consumer->copy(dst.data(), dev.data(), n * 4);

  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(ready->query());
  EXPECT_EQ(dst.as<float>()[n - 1], 0.0f) << "the consumer ran before the producer's event";
  gate.set_value();
  consumer->synchronize();
  EXPECT_EQ(dst.as<float>()[0], 42.0f);
  EXPECT_EQ(dst.as<float>()[n - 1], 42.0f);
  EXPECT_TRUE(ready->query());
  producer->synchronize();
  consumer.reset();
  producer.reset();
}

TEST(CudaDevice, EventWaitRefersToTheLatestRecord) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  auto a = g.dev->make_stream("a"), b = g.dev->make_stream("b");
  auto ev = g.dev->make_event();
  a->record(*ev);
  a->synchronize();
  EXPECT_TRUE(ev->query());
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  a->host_task("hold", [opened] { opened.wait(); });
  a->record(*ev);  // a new record: pending again
  EXPECT_FALSE(ev->query());
  Buffer flag = g.dev->alloc_host(4, true, "flag"), seen = g.dev->alloc_host(4, true, "seen");
  Buffer dev = g.dev->alloc(4, "dev");
  *flag.as<int>() = 0;
  *seen.as<int>() = -1;
  int* f = flag.as<int>();
  a->host_task("first", [f] { *f = 1; });
  a->copy(dev.data(), flag.data(), 4);
  a->record(*ev);
  b->wait(*ev);
  b->copy(seen.data(), dev.data(), 4);
  gate.set_value();
  b->synchronize();
  EXPECT_EQ(*seen.as<int>(), 1);
  a->synchronize();
  b.reset();
  a.reset();
}

TEST(CudaDevice, SynchronizeRethrowsHostTaskErrorsAndClearsThem) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  bool later_ran = false;
  g.s->host_task("exploding task", [] { throw std::runtime_error("boom"); });
  g.s->host_task("later task", [&] { later_ran = true; });  // poisoned stream: skipped
  const std::string msg = error_of([&] { g.s->synchronize(); });
  EXPECT_NE(msg.find("boom"), std::string::npos) << msg;
  EXPECT_NE(msg.find("exploding task"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'test'"), std::string::npos) << "names the stream: " << msg;
  EXPECT_FALSE(later_ran);
  EXPECT_NO_THROW(g.s->synchronize()) << "reported once, then cleared";
  g.s->host_task("after", [&] { later_ran = true; });
  g.s->synchronize();
  EXPECT_TRUE(later_ran);
  // A strata::Error passes through unchanged.
  g.s->host_task("strata error", [] { fail("test::where", "what failed: 7"); });
  const std::string msg2 = error_of([&] { g.s->synchronize(); });
  EXPECT_NE(msg2.find("[test::where] what failed: 7"), std::string::npos) << msg2;
}

TEST(CudaDevice, OpsOnAPoisonedStreamAreSkippedUntilSynchronize) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  std::vector<float> one(8, 1.0f);
  Buffer a = g.upload(one), out = g.upload(std::vector<float>(8, 5.0f));
  float* p = a.as<float>();
  g.ops().attention_fwd(*g.s, p, p, p, p, p, 1, 2, 3, 2, 4, 12, 8);  // 3 heads over 2 kv heads
  g.ops().add(*g.s, out.as<float>(), a.as<float>(), a.as<float>(), 8);  // skipped: poisoned
  const std::string msg = error_of([&] { g.s->synchronize(); });
  EXPECT_NE(msg.find("cuda::attention_fwd"), std::string::npos) << msg;
  EXPECT_EQ(g.download<float>(out, 8), std::vector<float>(8, 5.0f));
  g.ops().add(*g.s, out.as<float>(), a.as<float>(), a.as<float>(), 8);
  EXPECT_EQ(g.download<float>(out, 8), std::vector<float>(8, 2.0f));
}

TEST(CudaDevice, DestroyingAStreamWaitsForItsWork) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  std::atomic<bool> ran{false};
  {
    auto s = g.dev->make_stream("short-lived");
    s->host_task("slow", [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ran = true;
    });
  }
  EXPECT_TRUE(ran.load());
}

TEST(CudaDevice, RejectsStreamsAndEventsOfOtherDevices) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  auto cpu = make_device(DeviceKind::cpu);
  auto cpu_stream = cpu->make_stream("cpu");
  auto cpu_event = cpu->make_event();
  EXPECT_NE(error_of([&] { g.s->record(*cpu_event); }).find("another kind of device"), std::string::npos);
  EXPECT_NE(error_of([&] { g.s->wait(*cpu_event); }).find("another kind of device"), std::string::npos);
  Buffer b = g.dev->alloc(64, "b");
  const std::string msg = error_of([&] { g.ops().scale(*cpu_stream, b.as<float>(), 2.0f, 4); });
  EXPECT_NE(msg.find("not to a CUDA device"), std::string::npos) << msg;
  cpu_stream->synchronize();
}

// ---- memory ---------------------------------------------------------------------------------

TEST(CudaDevice, MemoryCapErrorNamesRequestUseAndLimit) {
  STRATA_REQUIRE_CUDA();
  Gpu g(64 * MiB);
  EXPECT_EQ(g.dev->memory().limit_bytes, 64 * MiB);
  const uint64_t before = g.dev->memory().used_bytes;
  Buffer first = g.dev->alloc(40 * MiB, "first buffer");
  EXPECT_EQ(g.dev->memory().used_bytes, before + 40 * MiB);
  const std::string msg = error_of([&] { Buffer second = g.dev->alloc(40 * MiB, "second buffer"); });
  EXPECT_NE(msg.find("second buffer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("40M"), std::string::npos) << msg;
  EXPECT_NE(msg.find("64M"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hint:"), std::string::npos) << msg;
  EXPECT_EQ(g.dev->memory().used_bytes, before + 40 * MiB) << "a refused request holds nothing";
  EXPECT_GE(g.dev->memory().peak_bytes, before + 40 * MiB);
  first.reset();
  EXPECT_EQ(g.dev->memory().used_bytes, before);
  g.dev->reset_peak();
  EXPECT_EQ(g.dev->memory().peak_bytes, before);
  Buffer again = g.dev->alloc(60 * MiB, "fits once the first is freed");
  EXPECT_TRUE(again);
}

TEST(CudaDevice, DeviceMemoryIsAlignedAndCounted) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const uint64_t before = g.dev->memory().used_bytes;
  Buffer b = g.dev->alloc(1, "one byte");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 256, 0u);
  EXPECT_EQ(b.memory(), MemoryKind::device);
  EXPECT_FALSE(b.pinned());
  EXPECT_EQ(g.dev->memory().used_bytes, before + 256);
}

TEST(CudaDevice, PinnedHostMemoryIsAlignedCountedAndCopies) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const uint64_t before = g.dev->memory().host_pinned_bytes;
  {
    Buffer p = g.dev->alloc_host(5000, true, "pinned");
    EXPECT_TRUE(p.pinned());
    EXPECT_EQ(p.memory(), MemoryKind::host_pinned);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.data()) % 4096, 0u) << "O_DIRECT needs 4096 alignment";
    EXPECT_EQ(p.bytes() % 4096, 0u);
    EXPECT_EQ(g.dev->memory().host_pinned_bytes, before + p.bytes());
    Buffer h = g.dev->alloc_host(5000, false, "pageable");
    EXPECT_FALSE(h.pinned());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(h.data()) % 4096, 0u);
    EXPECT_EQ(g.dev->memory().host_pinned_bytes, before + p.bytes());
  }
  EXPECT_EQ(g.dev->memory().host_pinned_bytes, before);
}

TEST(CudaDevice, CopiesBetweenEveryKindOfMemory) {
  STRATA_REQUIRE_CUDA();
  Gpu g;
  const size_t n = (1 << 20) + 3;
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.5f);
  Buffer pinned = g.dev->alloc_host(n * 4, true, "pinned"), pageable = g.dev->alloc_host(n * 4, false, "pageable");
  Buffer d1 = g.dev->alloc(n * 4, "d1"), d2 = g.dev->alloc(n * 4, "d2");
  Buffer back = g.dev->alloc_host(n * 4, true, "back"), back2 = g.dev->alloc_host(n * 4, false, "back2");
  std::memcpy(pageable.data(), v.data(), n * 4);
  g.s->copy(pinned.data(), pageable.data(), n * 4);  // host → pinned host
  g.s->copy(d1.data(), pinned.data(), n * 4);        // pinned → device
  g.s->copy(d2.data(), d1.data(), n * 4);            // device → device
  g.s->copy(back.data(), d2.data(), n * 4);          // device → pinned
  g.s->synchronize();
  EXPECT_EQ(std::memcmp(back.data(), v.data(), n * 4), 0);
  g.s->copy(back2.data(), d2.data(), n * 4);  // device → pageable
  g.s->synchronize();
  EXPECT_EQ(std::memcmp(back2.data(), v.data(), n * 4), 0);
}

}  // namespace
}  // namespace strata
