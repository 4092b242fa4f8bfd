// The NCCL communicator (comm/comm_nccl.h): every operation against values computed from the
// rank numbers (integers, exact in every type), in-place gathers, host buffers staged through
// the device, ordering against the caller's stream by events (a gated producer), split, and
// misuse. Plainly it runs one rank (Solo bootstrap, a 1-rank NCCL communicator); under mpirun
// with N ranks and at least N GPUs, N ranks with one GPU each. Skips without CUDA, NCCL, or
// enough GPUs (the condition is the same on every rank, so all ranks skip together).
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "comm/comm_registry.h"
#include "kernels/device.h"
#include "tests/gpu/gpu_test_util.h"

namespace strata {
namespace {

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    STRATA_REQUIRE_CUDA();
    if (!nccl_built()) GTEST_SKIP() << "this strata was built without NCCL";
    world_ = make_world_communicator();
    if (world_->size() > cuda_device_count())
      GTEST_SKIP() << world_->size() << " ranks need as many GPUs; " << cuda_device_count() << " visible";
    DeviceOptions o;
    o.ordinal = world_->rank() % cuda_device_count();
    dev_ = make_device(DeviceKind::cuda, o);
    s_ = dev_->make_stream("compute");
    comm_ = make_nccl_communicator(*world_, o.ordinal);
    P = comm_->size();
    r = comm_->rank();
  }
  void TearDown() override {
    comm_.reset();
    s_.reset();
    dev_.reset();
    world_.reset();
  }

  template <class T>
  Buffer up(const std::vector<T>& v) {
    Buffer d = dev_->alloc(v.size() * sizeof(T), "test");
    Buffer h = dev_->alloc_host(v.size() * sizeof(T), true, "staging");
    std::memcpy(h.data(), v.data(), v.size() * sizeof(T));
    s_->copy(d.data(), h.data(), v.size() * sizeof(T));
    s_->synchronize();
    return d;
  }
  template <class T>
  std::vector<T> down(const Buffer& d, size_t n) {
    Buffer h = dev_->alloc_host(n * sizeof(T), true, "staging");
    s_->copy(h.data(), d.data(), n * sizeof(T));
    s_->synchronize();
    std::vector<T> v(n);
    std::memcpy(v.data(), h.data(), n * sizeof(T));
    return v;
  }

  std::unique_ptr<Communicator> world_;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<Stream> s_;
  std::unique_ptr<Communicator> comm_;
  int P = 1, r = 0;
};

TEST_F(Nccl, AllReduceEveryTypeAndOp) {
  const size_t n = 1000;
  EXPECT_EQ(comm_->backend(), "nccl");
  std::vector<float> f(n), fmax(n);
  std::vector<double> d(n);
  std::vector<int32_t> i32(n);
  std::vector<uint16_t> b16(n);
  for (size_t i = 0; i < n; ++i) {
    f[i] = float(r + i);
    fmax[i] = float(r * 1000 + i);
    d[i] = 0.5 * r + i;
    i32[i] = r - int32_t(i);
    b16[i] = f32_to_bf16_bits(float(r + 1));
  }
  Buffer bf = up(f), bmax = up(fmax), bd = up(d), bi = up(i32), bb = up(b16);
  comm_->all_reduce(*s_, bf.data(), n, CommType::f32, ReduceOp::sum);
  comm_->all_reduce(*s_, bmax.data(), n, CommType::f32, ReduceOp::max);
  comm_->all_reduce(*s_, bd.data(), n, CommType::f64, ReduceOp::sum);
  comm_->all_reduce(*s_, bi.data(), n, CommType::i32, ReduceOp::sum);
  comm_->all_reduce(*s_, bb.data(), n, CommType::bf16, ReduceOp::sum);
  const auto gf = down<float>(bf, n), gmax = down<float>(bmax, n);
  const auto gd = down<double>(bd, n);
  const auto gi = down<int32_t>(bi, n);
  const auto gb = down<uint16_t>(bb, n);
  const double ranks = P * (P - 1) / 2.0;
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(gf[i], float(P * double(i) + ranks)) << i;
    ASSERT_EQ(gmax[i], float((P - 1) * 1000 + i)) << i;
    ASSERT_EQ(gd[i], 0.5 * ranks + P * double(i)) << i;
    ASSERT_EQ(gi[i], int32_t(ranks) - P * int32_t(i)) << i;
    ASSERT_EQ(bf16_bits_to_f32(gb[i]), float(ranks + P)) << i;
  }
}

TEST_F(Nccl, AllGatherReduceScatterAndBroadcast) {
  const size_t c = 777;
  std::vector<float> send(c), rs(c * size_t(P)), bc(c);
  for (size_t i = 0; i < c; ++i) send[i] = float(r * 100000 + i);
  for (int p = 0; p < P; ++p)
    for (size_t i = 0; i < c; ++i) rs[size_t(p) * c + i] = float(r + p * 10 + i);
  for (size_t i = 0; i < c; ++i) bc[i] = r == P - 1 ? float(7 + i) : -1.0f;
  // In place: this rank's piece already sits at its offset of the gathered buffer.
  std::vector<float> inplace(c * size_t(P), -1.0f);
  std::copy(send.begin(), send.end(), inplace.begin() + size_t(r) * c);
  Buffer bs = up(send), bg = dev_->alloc(c * P * 4, "gathered"), bip = up(inplace), brs = up(rs),
         brecv = dev_->alloc(c * 4, "scattered"), bbc = up(bc);
  comm_->all_gather(*s_, bg.data(), bs.data(), c, CommType::f32);
  comm_->all_gather(*s_, bip.data(), bip.data(), c, CommType::f32);
  comm_->reduce_scatter(*s_, brecv.data(), brs.data(), c, CommType::f32, ReduceOp::sum);
  comm_->broadcast(*s_, bbc.data(), c, CommType::f32, P - 1);
  comm_->barrier(*s_);
  const auto g = down<float>(bg, c * P), gip = down<float>(bip, c * P), grs = down<float>(brecv, c),
             gbc = down<float>(bbc, c);
  for (int p = 0; p < P; ++p)
    for (size_t i = 0; i < c; ++i) {
      ASSERT_EQ(g[size_t(p) * c + i], float(p * 100000 + i)) << p << " " << i;
      ASSERT_EQ(gip[size_t(p) * c + i], float(p * 100000 + i)) << "in place " << p << " " << i;
    }
  for (size_t i = 0; i < c; ++i) {
    ASSERT_EQ(grs[i], float(P * (P - 1) / 2 + P * (r * 10 + double(i)))) << i;
    ASSERT_EQ(gbc[i], float(7 + i)) << i;
  }
}

TEST_F(Nccl, SendAndRecv) {
  if (P < 2) GTEST_SKIP() << "point-to-point needs two ranks (run under mpirun -np 2 with 2 GPUs)";
  const size_t n = 4096;
  std::vector<int32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = int32_t(i) * 3 + 1;
  Buffer b = up(r == 0 ? v : std::vector<int32_t>(n, 0));
  if (r == 0) comm_->send(*s_, b.data(), n, CommType::i32, 1, 5);
  if (r == 1) comm_->recv(*s_, b.data(), n, CommType::i32, 0, 5);
  if (r <= 1) {
    EXPECT_EQ(down<int32_t>(b, n), v);
  }
  s_->synchronize();
}

TEST_F(Nccl, OrdersAfterTheCallersWorkWithoutHostWaits) {
  // The caller's stream is held at a gate by a host task; the producer's copy, the gather and
  // the consumer's copy are all enqueued behind it. Nothing may run until the gate opens, and
  // the enqueueing calls must return while it is closed (no host synchronization).
  const size_t c = 1 << 20;
  Buffer src = dev_->alloc_host(c * 4, true, "src"), dst = dev_->alloc_host(c * P * 4, true, "dst");
  Buffer dsend = dev_->alloc(c * 4, "send"), drecv = dev_->alloc(c * P * 4, "recv");
  std::fill_n(dst.as<float>(), c * P, -1.0f);
  float* sp = src.as<float>();
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  s_->host_task("gate", [opened] { opened.wait(); });
  const int me = r;
  s_->host_task("produce", [sp, c, me] { std::fill_n(sp, c, float(me + 1)); });
  s_->copy(dsend.data(), src.data(), c * 4);
  comm_->all_gather(*s_, drecv.data(), dsend.data(), c, CommType::f32);
  s_->copy(dst.data(), drecv.data(), c * P * 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(dst.as<float>()[0], -1.0f) << "ran before the caller's earlier work";
  gate.set_value();
  s_->synchronize();
  for (int p = 0; p < P; ++p) {
    EXPECT_EQ(dst.as<float>()[size_t(p) * c], float(p + 1));
    EXPECT_EQ(dst.as<float>()[size_t(p) * c + c - 1], float(p + 1));
  }
}

TEST_F(Nccl, StagesHostBuffers) {
  // The engine all-reduces host scalars (gradient norms, loss sums): pinned and pageable memory
  // go through the device and come back in stream order.
  Buffer pinned = dev_->alloc_host(64, true, "pinned"), pageable = dev_->alloc_host(64, false, "pageable");
  pinned.as<double>()[0] = r + 1.5;
  pageable.as<double>()[0] = 2.0 * r;
  comm_->all_reduce(*s_, pinned.data(), 1, CommType::f64, ReduceOp::sum);
  comm_->all_reduce(*s_, pageable.data(), 1, CommType::f64, ReduceOp::max);
  s_->synchronize();
  EXPECT_EQ(pinned.as<double>()[0], P * (P - 1) / 2.0 + 1.5 * P);
  EXPECT_EQ(pageable.as<double>()[0], 2.0 * (P - 1));
  // A device send into a pinned host receive buffer.
  Buffer d = up(std::vector<float>(3, float(r)));
  Buffer gathered = dev_->alloc_host(3 * 4 * size_t(P), true, "gathered");
  comm_->all_gather(*s_, gathered.data(), d.data(), 3, CommType::f32);
  s_->synchronize();
  for (int p = 0; p < P; ++p) EXPECT_EQ(gathered.as<float>()[3 * p + 2], float(p));
}

TEST_F(Nccl, SplitMakesWorkingSubCommunicators) {
  auto sub = comm_->split(r % 2, r);
  ASSERT_TRUE(sub);
  EXPECT_EQ(sub->backend(), "nccl");
  EXPECT_EQ(sub->size(), (P - r % 2 + 1) / 2);
  EXPECT_EQ(sub->rank(), r / 2);
  Buffer b = up(std::vector<float>(10, 1.0f));
  sub->all_reduce(*s_, b.data(), 10, CommType::f32, ReduceOp::sum);
  EXPECT_EQ(down<float>(b, 10), std::vector<float>(10, float(sub->size())));
  sub.reset();
  auto none = comm_->split(-1, 0);  // every rank leaves: nobody gets a communicator
  EXPECT_FALSE(none);
}

TEST_F(Nccl, RejectsStreamsOfOtherDevices) {
  auto cpu = make_device(DeviceKind::cpu);
  auto cpu_stream = cpu->make_stream("cpu");
  std::vector<float> v(4, 1.0f);
  try {
    comm_->all_reduce(*cpu_stream, v.data(), 4, CommType::f32, ReduceOp::sum);
    ADD_FAILURE() << "a CPU stream was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not to a CUDA device"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace strata
