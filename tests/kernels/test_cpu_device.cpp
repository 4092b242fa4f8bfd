// The CPU device: stream order, events across streams, error propagation through synchronize,
// the memory cap, Buffer ownership, and the Ops launchers (each op dispatched with its arguments
// in order; reference and fast modes agree on a small decoder block, forward and backward).
// Ordering tests use gates (promises the test releases), not sleeps, so they cannot pass by luck
// of timing nor fail by slowness.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/size.h"
#include "core/watchdog.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "tests/kernels/op_test_util.h"

namespace strata {
namespace {

using test::random_tokens;
using test::random_vec;

std::unique_ptr<Device> cpu_device(CpuOpsMode mode = CpuOpsMode::fast, uint64_t limit = 0) {
  DeviceOptions o;
  o.cpu_ops = mode;
  o.mem_limit_bytes = limit;
  return make_device(DeviceKind::cpu, o);
}

// ---- streams and events ---------------------------------------------------------------------

TEST(CpuDevice, StreamRunsWorkInOrder) {
  auto dev = cpu_device();
  auto s = dev->make_stream("compute");
  std::vector<int> seen;  // only the stream's worker touches it until synchronize
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  s->host_task("wait for the test", [opened] { opened.wait(); });
  for (int i = 0; i < 100; ++i) s->host_task("append", [&seen, i] { seen.push_back(i); });
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  s->copy(a.data(), b.data(), a.size() * sizeof(float));  // after the appends
  s->fill_zero(b.data(), b.size() * sizeof(float));       // after the copy
  gate.set_value();
  s->synchronize();
  ASSERT_EQ(seen.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(seen[i], i);
  EXPECT_EQ(a[999], 2.0f);
  EXPECT_EQ(b[0], 0.0f);
}

TEST(CpuDevice, EventOrdersConsumerAfterProducer) {
  auto dev = cpu_device();
  auto producer = dev->make_stream("producer"), consumer = dev->make_stream("consumer");
  auto ready = dev->make_event();
  EXPECT_TRUE(ready->query()) << "an event never recorded is complete";

  std::promise<void> gate;
  auto opened = gate.get_future().share();
  std::atomic<int> value{0};
  std::atomic<bool> consumer_ran{false};
  int consumed = -1;
  producer->host_task("produce", [opened, &value] {
    opened.wait();
    value = 42;
  });
  producer->record(*ready);
  consumer->wait(*ready);
  consumer->host_task("consume", [&] {
    consumed = value;
    consumer_ran = true;
  });

  // The producer is held at the gate: the event is pending and the consumer has not run.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(ready->query());
  EXPECT_FALSE(consumer_ran.load());
  gate.set_value();
  consumer->synchronize();  // the consumer finishing implies the producer's event completed
  EXPECT_EQ(consumed, 42);
  EXPECT_TRUE(ready->query());
  ready->synchronize();
  producer->synchronize();
}

TEST(CpuDevice, EventWaitRefersToTheLatestRecord) {
  auto dev = cpu_device();
  auto a = dev->make_stream("a"), b = dev->make_stream("b");
  auto ev = dev->make_event();
  a->record(*ev);
  a->synchronize();
  EXPECT_TRUE(ev->query());
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  a->host_task("hold", [opened] { opened.wait(); });
  a->record(*ev);  // a new record: pending again
  EXPECT_FALSE(ev->query());
  int order = 0, seen = -1;
  a->host_task("first", [&order] { order = 1; });
  a->record(*ev);
  b->wait(*ev);
  b->host_task("second", [&] { seen = order; });
  gate.set_value();
  b->synchronize();
  EXPECT_EQ(seen, 1);
  a->synchronize();
}

// The host's wait for an event is watched, and the watchdog's report names the stream that
// recorded it.
TEST(CpuDevice, TheWatchdogNamesTheStreamAnEventWaitsFor) {
  auto dev = cpu_device();
  auto s = dev->make_stream("optimizer");
  auto ev = dev->make_event();
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  s->host_task("hold", [opened] { opened.wait(); });
  s->record(*ev);
  std::thread host([&] { ev->synchronize(); });
  std::string report;
  for (int i = 0; i < 500 && report.empty(); ++i) {  // bounded: 5 s
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    report = watchdog_report_now(0.001);
  }
  gate.set_value();
  host.join();
  s->synchronize();
  EXPECT_NE(report.find("the host waits for an event recorded on stream 'optimizer'"),
            std::string::npos)
      << report;
}

TEST(CpuDevice, SynchronizeRethrowsTaskErrorAsStrataErrorAndClearsIt) {
  auto dev = cpu_device();
  auto s = dev->make_stream("compute");
  bool later_ran = false;
  s->host_task("exploding op", [] { throw std::runtime_error("boom"); });
  s->host_task("later op", [&] { later_ran = true; });  // poisoned stream: skipped
  try {
    s->synchronize();
    FAIL() << "synchronize did not rethrow";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("boom"), std::string::npos) << m;
    EXPECT_NE(m.find("exploding op"), std::string::npos) << m;
    EXPECT_NE(m.find("compute"), std::string::npos) << m;
  }
  EXPECT_FALSE(later_ran);
  EXPECT_NO_THROW(s->synchronize()) << "the error must be cleared once reported";
  s->host_task("after", [&] { later_ran = true; });
  s->synchronize();
  EXPECT_TRUE(later_ran);

  // A strata::Error thrown by a task (e.g. an op's argument check) comes back unchanged.
  auto& ops = dev->ops();
  std::vector<float> x(6), cs(3, 1.0f);
  ops.rope_fwd(*s, x.data(), cs.data(), cs.data(), 1, 2, 1, 3, 3);  // odd head dim
  try {
    s->synchronize();
    FAIL() << "bad rope shape not reported";
  } catch (const Error& e) {
    EXPECT_EQ(e.where(), "cpu::rope_fwd") << e.what();
  }
}

// ---- memory ---------------------------------------------------------------------------------

TEST(CpuDevice, MemoryCapErrorNamesRequestAndLimit) {
  auto dev = cpu_device(CpuOpsMode::fast, 1 * MiB);
  Buffer a = dev->alloc(512 * KiB, "weights");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % 256, 0u);
  EXPECT_EQ(dev->memory().used_bytes, 512 * KiB);
  try {
    Buffer b = dev->alloc(768 * KiB, "activations of block 3");
    FAIL() << "allocation past the cap succeeded";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("activations of block 3"), std::string::npos) << m;
    EXPECT_NE(m.find(format_bytes(768 * KiB)), std::string::npos) << m;
    EXPECT_NE(m.find(format_bytes(1 * MiB)), std::string::npos) << m;
  }
  EXPECT_EQ(dev->memory().used_bytes, 512 * KiB) << "a failed allocation must not count";
  a.reset();
  EXPECT_EQ(dev->memory().used_bytes, 0u);
  Buffer c = dev->alloc(1 * MiB, "fits exactly");
  EXPECT_TRUE(c);
  EXPECT_EQ(dev->memory().peak_bytes, 1 * MiB);
}

TEST(CpuDevice, BufferMoveTransfersOwnership) {
  auto dev = cpu_device(CpuOpsMode::fast, 4 * MiB);
  Buffer a = dev->alloc(1 * MiB, "a");
  void* p = a.data();
  Buffer b(std::move(a));
  EXPECT_FALSE(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.bytes(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.bytes(), 1 * MiB);
  EXPECT_EQ(b.memory(), MemoryKind::device);
  EXPECT_EQ(dev->memory().used_bytes, 1 * MiB);

  Buffer c = dev->alloc(2 * MiB, "c");
  c = std::move(b);  // c's old 2M are released, b's 1M now owned by c
  EXPECT_EQ(c.data(), p);
  EXPECT_FALSE(b);
  EXPECT_EQ(dev->memory().used_bytes, 1 * MiB);
  { Buffer d = std::move(c); }  // destructor releases
  EXPECT_EQ(dev->memory().used_bytes, 0u);

  Buffer h = dev->alloc_host(10000, true, "staging");
  EXPECT_TRUE(h.pinned());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h.data()) % 4096, 0u);
  EXPECT_GE(dev->memory().host_pinned_bytes, 10000u);
  h.reset();
  EXPECT_EQ(dev->memory().host_pinned_bytes, 0u);
  EXPECT_EQ(dev->memory().used_bytes, 0u) << "host memory is not device memory";
}

// ---- ops through the Ops interface ----------------------------------------------------------

// Each launcher must pass its arguments in order to the implementation. Since the fast path is
// deterministic, an op run through Ops on a fast device must match the direct call bit for bit;
// distinct values in every argument make a swap visible.
TEST(CpuOps, LaunchersPassArgumentsInOrder) {
  auto dev = cpu_device(CpuOpsMode::fast);
  auto s = dev->make_stream("ops");
  Ops& ops = dev->ops();
  namespace fast = cpu::fast;
  const int B = 2, T = 9, H = 4, KVH = 2, D = 8, C = H * D, N = B * T, F = 24, V = 13;
  const int ldqkv = (H + 2 * KVH) * D;
  auto x = random_vec(size_t(N) * C, 1), w = random_vec(C, 2, 0.5, 1.5);
  auto g = random_vec(size_t(N) * C, 3), wl = random_vec(size_t(F) * C, 4);
  auto qkv = random_vec(size_t(N) * ldqkv, 5), gu = random_vec(size_t(N) * 2 * F, 6);
  auto gF = random_vec(size_t(N) * F, 7), logits = random_vec(size_t(N) * V, 8, -4.0, 4.0);
  auto tokens = random_tokens(N, V, 9);
  auto wte = random_vec(size_t(V) * C, 10);
  tokens[3] = -1;  // an ignored target for cross-entropy (embedding gets its own tokens)
  auto emb_tokens = random_tokens(N, V, 11);

  auto expect_same = [](const char* what, const std::vector<float>& a,
                        const std::vector<float>& b) {
    test::expect_equal(std::string("through Ops: ") + what, a, b);
  };
  std::vector<float> a, b, a2, b2;
  // embedding
  a.assign(size_t(N) * C, 0);
  b = a;
  ops.embedding_fwd(*s, a.data(), emb_tokens.data(), wte.data(), N, C, V);
  fast::embedding_fwd(b.data(), emb_tokens.data(), wte.data(), N, C, V);
  s->synchronize();
  expect_same("embedding_fwd", a, b);
  a = wte;
  b = wte;
  ops.embedding_bwd(*s, a.data(), g.data(), emb_tokens.data(), N, C, V);
  fast::embedding_bwd(b.data(), g.data(), emb_tokens.data(), N, C, V);
  s->synchronize();
  expect_same("embedding_bwd", a, b);
  // rmsnorm
  std::vector<float> r1(N), r2(N);
  a.assign(size_t(N) * C, 0);
  b = a;
  ops.rmsnorm_fwd(*s, a.data(), r1.data(), x.data(), w.data(), N, C, 1e-5f);
  fast::rmsnorm_fwd(b.data(), r2.data(), x.data(), w.data(), N, C, 1e-5f);
  s->synchronize();
  expect_same("rmsnorm_fwd", a, b);
  expect_same("rmsnorm_fwd rstd", r1, r2);
  a = g;
  b = g;
  a2 = w;
  b2 = w;
  ops.rmsnorm_bwd(*s, a.data(), a2.data(), x.data(), g.data(), w.data(), r1.data(), N, C);
  fast::rmsnorm_bwd(b.data(), b2.data(), x.data(), g.data(), w.data(), r1.data(), N, C);
  s->synchronize();
  expect_same("rmsnorm_bwd dx", a, b);
  expect_same("rmsnorm_bwd dw", a2, b2);
  // linear
  a.assign(size_t(N) * F, 0);
  b = a;
  ops.linear_fwd(*s, a.data(), x.data(), wl.data(), N, C, F);
  fast::linear_fwd(b.data(), x.data(), wl.data(), N, C, F);
  s->synchronize();
  expect_same("linear_fwd", a, b);
  a.assign(size_t(N) * C, 0);
  b = a;
  a2 = wl;
  b2 = wl;
  ops.linear_bwd(*s, a.data(), a2.data(), gF.data(), x.data(), wl.data(), N, C, F);
  fast::linear_bwd(b.data(), b2.data(), gF.data(), x.data(), wl.data(), N, C, F);
  s->synchronize();
  expect_same("linear_bwd din", a, b);
  expect_same("linear_bwd dw", a2, b2);
  // rope (on the q part of qkv, rows ldqkv apart)
  a = qkv;
  b = qkv;
  const auto rope_cos = random_vec(size_t(T) * D / 2, 12);
  const auto rope_sin = random_vec(rope_cos.size(), 13);
  ops.rope_fwd(*s, a.data(), rope_cos.data(), rope_sin.data(), B, T, H, D, ldqkv);
  fast::rope_fwd(b.data(), rope_cos.data(), rope_sin.data(), B, T, H, D, ldqkv);
  s->synchronize();
  expect_same("rope_fwd", a, b);
  ops.rope_bwd(*s, a.data(), rope_cos.data(), rope_sin.data(), B, T, KVH, D, ldqkv);
  fast::rope_bwd(b.data(), rope_cos.data(), rope_sin.data(), B, T, KVH, D, ldqkv);
  s->synchronize();
  expect_same("rope_bwd", a, b);
  // attention
  const float *q = qkv.data(), *k = q + H * D, *v = k + KVH * D;
  std::vector<float> o1(size_t(N) * C), o2(o1.size()), l1(size_t(B) * H * T), l2(l1.size());
  ops.attention_fwd(*s, o1.data(), l1.data(), q, k, v, B, T, H, KVH, D, ldqkv, ldqkv);
  fast::attention_fwd(o2.data(), l2.data(), q, k, v, B, T, H, KVH, D, ldqkv, ldqkv);
  s->synchronize();
  expect_same("attention_fwd", o1, o2);
  expect_same("attention_fwd lse", l1, l2);
  a.assign(qkv.size(), 0);
  b = a;
  ops.attention_bwd(*s, a.data(), a.data() + H * D, a.data() + (H + KVH) * D, g.data(), o1.data(),
                    l1.data(), q, k, v, B, T, H, KVH, D, ldqkv, ldqkv);
  fast::attention_bwd(b.data(), b.data() + H * D, b.data() + (H + KVH) * D, g.data(), o1.data(),
                      l1.data(), q, k, v, B, T, H, KVH, D, ldqkv, ldqkv);
  s->synchronize();
  expect_same("attention_bwd", a, b);
  // swiglu
  a.assign(size_t(N) * F, 0);
  b = a;
  ops.swiglu_fwd(*s, a.data(), gu.data(), gu.data() + F, N, F, 2 * F);
  fast::swiglu_fwd(b.data(), gu.data(), gu.data() + F, N, F, 2 * F);
  s->synchronize();
  expect_same("swiglu_fwd", a, b);
  a.assign(gu.size(), 0);
  b = a;
  ops.swiglu_bwd(*s, a.data(), a.data() + F, gF.data(), gu.data(), gu.data() + F, N, F, 2 * F);
  fast::swiglu_bwd(b.data(), b.data() + F, gF.data(), gu.data(), gu.data() + F, N, F, 2 * F);
  s->synchronize();
  expect_same("swiglu_bwd", a, b);
  // cross-entropy
  a.assign(N, 0);
  b = a;
  ops.cross_entropy_fwd(*s, a.data(), logits.data(), tokens.data(), N, V);
  fast::cross_entropy_fwd(b.data(), logits.data(), tokens.data(), N, V);
  s->synchronize();
  expect_same("cross_entropy_fwd", a, b);
  a.assign(logits.size(), 0);
  b = a;
  ops.cross_entropy_bwd(*s, a.data(), logits.data(), tokens.data(), 0.125f, N, V);
  fast::cross_entropy_bwd(b.data(), logits.data(), tokens.data(), 0.125f, N, V);
  s->synchronize();
  expect_same("cross_entropy_bwd", a, b);
  // elementwise
  a.assign(x.size(), 0);
  b = a;
  ops.add(*s, a.data(), x.data(), g.data(), x.size());
  fast::add(b.data(), x.data(), g.data(), x.size());
  ops.scale(*s, a.data(), 0.3f, x.size());
  fast::scale(b.data(), 0.3f, x.size());
  s->synchronize();
  expect_same("add, scale", a, b);
  std::vector<uint16_t> h1(x.size()), h2(x.size());
  ops.cast_f32_to_bf16(*s, h1.data(), x.data(), x.size());
  fast::cast_f32_to_bf16(h2.data(), x.data(), x.size());
  a.assign(x.size(), 0);
  b = a;
  ops.cast_bf16_to_f32(*s, a.data(), h1.data(), x.size());
  fast::cast_bf16_to_f32(b.data(), h2.data(), x.size());
  double s1 = 0, s2 = 0, q1 = 0, q2 = 0;
  ops.sum(*s, &s1, x.data(), x.size());
  ops.sum_squares(*s, &q1, x.data(), x.size());
  fast::sum(&s2, x.data(), x.size());
  fast::sum_squares(&q2, x.data(), x.size());
  s->synchronize();
  EXPECT_EQ(h1, h2);
  expect_same("casts", a, b);
  EXPECT_EQ(s1, s2);
  EXPECT_EQ(q1, q2);
  EXPECT_NE(s1, q1);
}

// Ops on several streams at once share oneTBB's workers and the fast path's per-thread scratch
// and caches; each stream's results must be the bits it gets alone.
TEST(CpuOps, ConcurrentStreamsGetTheSameBitsAsOneStream) {
  auto dev = cpu_device(CpuOpsMode::fast);
  Ops& ops = dev->ops();
  const int B = 2, T = 100, H = 4, KVH = 2, D = 16, N = B * T, C = H * D;
  const int ld = (H + 2 * KVH) * D;
  struct Work {
    std::vector<float> qkv, dout, out, lse, dqkv, x, w, y, rstd, dx, dw;
  };
  auto make = [&](uint32_t seed) {
    Work k;
    k.qkv = random_vec(size_t(N) * ld, seed);
    k.dout = random_vec(size_t(N) * C, seed + 1);
    k.out.assign(size_t(N) * C, 0);
    k.lse.assign(size_t(B) * H * T, 0);
    k.dqkv.assign(k.qkv.size(), 0);
    k.x = random_vec(size_t(N) * 333, seed + 2);
    k.w = random_vec(333, seed + 3, 0.5, 1.5);
    k.y.assign(k.x.size(), 0);
    k.rstd.assign(N, 0);
    k.dx.assign(k.x.size(), 0);
    k.dw.assign(333, 0);
    return k;
  };
  auto enqueue = [&](Stream& s, Work& k, const test::RopeTablesAs<float>& rope) {
    for (int rep = 0; rep < 3; ++rep) {
      ops.rope_fwd(s, k.qkv.data(), rope.cos.data(), rope.sin.data(), B, T, H + KVH, D, ld);
      ops.attention_fwd(s, k.out.data(), k.lse.data(), k.qkv.data(), k.qkv.data() + H * D,
                        k.qkv.data() + (H + KVH) * D, B, T, H, KVH, D, ld, ld);
      ops.attention_bwd(s, k.dqkv.data(), k.dqkv.data() + H * D, k.dqkv.data() + (H + KVH) * D,
                        k.dout.data(), k.out.data(), k.lse.data(), k.qkv.data(),
                        k.qkv.data() + H * D, k.qkv.data() + (H + KVH) * D, B, T, H, KVH, D, ld,
                        ld);
      ops.rmsnorm_fwd(s, k.y.data(), k.rstd.data(), k.x.data(), k.w.data(), N, 333, 1e-6f);
      ops.rmsnorm_bwd(s, k.dx.data(), k.dw.data(), k.y.data(), k.x.data(), k.w.data(),
                      k.rstd.data(), N, 333);
    }
  };
  const auto variants = test::rope_variants();  // a distinct rope table per stream
  std::vector<test::RopeTablesAs<float>> tables;
  for (int i = 0; i < 3; ++i) tables.emplace_back(variants[size_t(i) + 1].second, T, D);
  std::vector<Work> alone, together;
  for (int i = 0; i < 3; ++i) {
    alone.push_back(make(10 * i));
    together.push_back(make(10 * i));
  }
  auto single = dev->make_stream("single");
  for (int i = 0; i < 3; ++i) enqueue(*single, alone[i], tables[size_t(i)]);
  single->synchronize();
  std::vector<std::unique_ptr<Stream>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(dev->make_stream("s" + std::to_string(i)));
  for (int i = 0; i < 3; ++i) enqueue(*streams[i], together[i], tables[size_t(i)]);
  for (auto& s : streams) s->synchronize();
  for (int i = 0; i < 3; ++i) {
    test::expect_equal("concurrent attention out", together[i].out, alone[i].out);
    test::expect_equal("concurrent attention grads", together[i].dqkv, alone[i].dqkv);
    test::expect_equal("concurrent rope", together[i].qkv, alone[i].qkv);
    test::expect_equal("concurrent rmsnorm dx", together[i].dx, alone[i].dx);
    test::expect_equal("concurrent rmsnorm dw", together[i].dw, alone[i].dw);
  }
}

// A tiny decoder block with an output head, forward and backward, through the Ops of a fast
// device and of a reference device; the losses and every gradient must agree.
struct BlockRun {
  std::vector<float> losses, dwte, dnorm1, dwqkv, dwo, dnorm2, dwgu, dwdown, dwhead;
  double loss_sum = 0, grad_sq = 0;
};

BlockRun run_block(CpuOpsMode mode) {
  auto dev = cpu_device(mode);
  auto s = dev->make_stream("block");
  Ops& ops = dev->ops();
  const int B = 2, T = 70, H = 4, KVH = 2, D = 16, C = H * D, F = 48, V = 37, N = B * T;
  const int ldqkv = (H + 2 * KVH) * D;
  auto tokens = random_tokens(N, V, 100), targets = random_tokens(N, V, 101);
  targets[5] = -1;
  auto wte = random_vec(size_t(V) * C, 102, -0.5, 0.5);
  auto n1 = random_vec(C, 103, 0.8, 1.2), n2 = random_vec(C, 104, 0.8, 1.2);
  auto wqkv = random_vec(size_t(ldqkv) * C, 105, -0.2, 0.2);
  auto wo = random_vec(size_t(C) * C, 106, -0.2, 0.2);
  auto wgu = random_vec(size_t(2 * F) * C, 107, -0.2, 0.2);
  auto wdown = random_vec(size_t(C) * F, 108, -0.2, 0.2);
  auto whead = random_vec(size_t(V) * C, 109, -0.2, 0.2);
  auto buf = [](size_t n) { return std::vector<float>(n, 0.0f); };
  auto x0 = buf(size_t(N) * C), h1 = buf(x0.size()), r1 = buf(N), qkv = buf(size_t(N) * ldqkv);
  auto att = buf(x0.size()), lse = buf(size_t(B) * H * T), ao = buf(x0.size()), x1 = buf(x0.size());
  auto h2 = buf(x0.size()), r2 = buf(N), gu = buf(size_t(N) * 2 * F), act = buf(size_t(N) * F);
  auto mo = buf(x0.size()), x2 = buf(x0.size()), logits = buf(size_t(N) * V);
  BlockRun r;
  r.losses = buf(N);
  // forward
  ops.embedding_fwd(*s, x0.data(), tokens.data(), wte.data(), N, C, V);
  ops.rmsnorm_fwd(*s, h1.data(), r1.data(), x0.data(), n1.data(), N, C, 1e-5f);
  ops.linear_fwd(*s, qkv.data(), h1.data(), wqkv.data(), N, C, ldqkv);
  const test::RopeTablesAs<float> rope(test::rope_variants().back().second, T, D);  // llama3
  ops.rope_fwd(*s, qkv.data(), rope.cos.data(), rope.sin.data(), B, T, H, D, ldqkv);
  ops.rope_fwd(*s, qkv.data() + H * D, rope.cos.data(), rope.sin.data(), B, T, KVH, D, ldqkv);
  ops.attention_fwd(*s, att.data(), lse.data(), qkv.data(), qkv.data() + H * D,
                    qkv.data() + (H + KVH) * D, B, T, H, KVH, D, ldqkv, ldqkv);
  ops.linear_fwd(*s, ao.data(), att.data(), wo.data(), N, C, C);
  ops.add(*s, x1.data(), x0.data(), ao.data(), x0.size());
  ops.rmsnorm_fwd(*s, h2.data(), r2.data(), x1.data(), n2.data(), N, C, 1e-5f);
  ops.linear_fwd(*s, gu.data(), h2.data(), wgu.data(), N, C, 2 * F);
  ops.swiglu_fwd(*s, act.data(), gu.data(), gu.data() + F, N, F, 2 * F);
  ops.linear_fwd(*s, mo.data(), act.data(), wdown.data(), N, F, C);
  ops.add(*s, x2.data(), x1.data(), mo.data(), x1.size());
  ops.linear_fwd(*s, logits.data(), x2.data(), whead.data(), N, C, V);
  ops.cross_entropy_fwd(*s, r.losses.data(), logits.data(), targets.data(), N, V);
  ops.sum(*s, &r.loss_sum, r.losses.data(), N);
  // backward (parameter grads accumulate from zero; the residual stream's grads accumulate
  // through rmsnorm_bwd's dx)
  r.dwte = buf(wte.size());
  r.dnorm1 = buf(C);
  r.dwqkv = buf(wqkv.size());
  r.dwo = buf(wo.size());
  r.dnorm2 = buf(C);
  r.dwgu = buf(wgu.size());
  r.dwdown = buf(wdown.size());
  r.dwhead = buf(whead.size());
  auto dx2 = buf(x0.size()), dact = buf(act.size()), dgu = buf(gu.size()), dh = buf(x0.size());
  auto dqkv = buf(qkv.size()), datt = buf(x0.size());
  ops.cross_entropy_bwd(*s, logits.data(), logits.data(), targets.data(), 1.0f / N, N, V);
  ops.linear_bwd(*s, dx2.data(), r.dwhead.data(), logits.data(), x2.data(), whead.data(), N, C, V);
  // x2 = x1 + mo: dx1 starts as dx2 (copy), mo's branch adds through rmsnorm_bwd.
  ops.linear_bwd(*s, dact.data(), r.dwdown.data(), dx2.data(), act.data(), wdown.data(), N, F, C);
  ops.swiglu_bwd(*s, dgu.data(), dgu.data() + F, dact.data(), gu.data(), gu.data() + F, N, F,
                 2 * F);
  ops.linear_bwd(*s, dh.data(), r.dwgu.data(), dgu.data(), h2.data(), wgu.data(), N, C, 2 * F);
  ops.rmsnorm_bwd(*s, dx2.data(), r.dnorm2.data(), dh.data(), x1.data(), n2.data(), r2.data(), N,
                  C);
  ops.linear_bwd(*s, datt.data(), r.dwo.data(), dx2.data(), att.data(), wo.data(), N, C, C);
  ops.attention_bwd(*s, dqkv.data(), dqkv.data() + H * D, dqkv.data() + (H + KVH) * D, datt.data(),
                    att.data(), lse.data(), qkv.data(), qkv.data() + H * D,
                    qkv.data() + (H + KVH) * D, B, T, H, KVH, D, ldqkv, ldqkv);
  ops.rope_bwd(*s, dqkv.data(), rope.cos.data(), rope.sin.data(), B, T, H, D, ldqkv);
  ops.rope_bwd(*s, dqkv.data() + H * D, rope.cos.data(), rope.sin.data(), B, T, KVH, D, ldqkv);
  ops.linear_bwd(*s, dh.data(), r.dwqkv.data(), dqkv.data(), h1.data(), wqkv.data(), N, C, ldqkv);
  ops.rmsnorm_bwd(*s, dx2.data(), r.dnorm1.data(), dh.data(), x0.data(), n1.data(), r1.data(), N,
                  C);
  ops.embedding_bwd(*s, r.dwte.data(), dx2.data(), tokens.data(), N, C, V);
  ops.sum_squares(*s, &r.grad_sq, r.dwqkv.data(), r.dwqkv.size());
  s->synchronize();
  return r;
}

TEST(CpuOps, ReferenceAndFastModesAgreeOnADecoderBlock) {
  const BlockRun f = run_block(CpuOpsMode::fast);
  const BlockRun r = run_block(CpuOpsMode::reference);
  // Each op agrees to a few u·(size of its terms) (test_fast_ops, test_fast_gemm); through ~15
  // ops of depth the differences stay far below 1e-4 of each tensor's largest element, while a
  // wrong op changes results at the 1e-1 level.
  auto close = [](const char* what, const std::vector<float>& a, const std::vector<float>& b) {
    test::expect_close(std::string("fast vs reference mode: ") + what, a, b, 0.0,
                       1e-4 * std::max(1e-30, test::max_abs(b)));
  };
  close("losses", f.losses, r.losses);
  close("dwte", f.dwte, r.dwte);
  close("dnorm1", f.dnorm1, r.dnorm1);
  close("dwqkv", f.dwqkv, r.dwqkv);
  close("dwo", f.dwo, r.dwo);
  close("dnorm2", f.dnorm2, r.dnorm2);
  close("dwgu", f.dwgu, r.dwgu);
  close("dwdown", f.dwdown, r.dwdown);
  close("dwhead", f.dwhead, r.dwhead);
  EXPECT_NEAR(f.loss_sum, r.loss_sum, 1e-5 * std::fabs(r.loss_sum));
  EXPECT_NEAR(f.grad_sq, r.grad_sq, 1e-4 * r.grad_sq);
  EXPECT_GT(r.grad_sq, 0.0);
  // The loss of near-uniform logits over 37 classes is about log 37 per counted token.
  EXPECT_NEAR(r.loss_sum / 139, std::log(37.0), 0.5);
}

}  // namespace
}  // namespace strata
