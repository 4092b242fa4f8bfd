// Communicator conformance, written once and run on every backend: plainly (Solo) and under
// mpirun with 2, 3 and 4 ranks (MPI). Every collective at odd sizes and several element types,
// sub-communicators from split(), point-to-point in a ring, broadcast from every root, and the
// device mesh. Values are exact small integers, so results must be equal, not close.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>

#include "core/dtype.h"
#include "core/error.h"
#include "comm/comm.h"
#include "comm/comm_registry.h"
#include "comm/mesh.h"
#include "kernels/device.h"

using namespace strata;

namespace {

struct Env {
  std::unique_ptr<Communicator> world = make_world_communicator();
  std::unique_ptr<Device> device = make_device(DeviceKind::cpu);
  std::unique_ptr<Stream> stream = device->make_stream("comm");
};

Env& env() {
  static Env e;
  return e;
}

const size_t kCounts[] = {1, 7, 1000, 4097, 100003};

float value(int rank, size_t i) { return float(int(i % 1000) + 3 * rank); }

void run_collectives(Communicator& c, Stream& s) {
  const int n = c.size(), r = c.rank();
  for (size_t count : kCounts) {
    SCOPED_TRACE(testing::Message() << c.backend() << " size " << n << " count " << count);
    // all_gather f32
    std::vector<float> send(count), recv(count * n, -1.f);
    for (size_t i = 0; i < count; ++i) send[i] = value(r, i);
    c.all_gather(s, recv.data(), send.data(), count, CommType::f32);
    s.synchronize();
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv[q * count + i], value(q, i));
    // all_gather bf16 (raw 16-bit patterns)
    std::vector<uint16_t> send16(count), recv16(count * n);
    for (size_t i = 0; i < count; ++i) send16[i] = f32_to_bf16_bits(value(r, i));
    c.all_gather(s, recv16.data(), send16.data(), count, CommType::bf16);
    s.synchronize();
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(recv16[q * count + i], f32_to_bf16_bits(value(q, i)));
    // reduce_scatter sum f32: rank q receives sum over ranks of their block q
    std::vector<float> full(count * n), part(count, -1.f);
    for (int q = 0; q < n; ++q)
      for (size_t i = 0; i < count; ++i) full[q * count + i] = value(r, i) + float(q);
    c.reduce_scatter(s, part.data(), full.data(), count, CommType::f32, ReduceOp::sum);
    s.synchronize();
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int p = 0; p < n; ++p) want += value(p, i) + float(r);
      ASSERT_EQ(part[i], want);
    }
    // all_reduce: sum f64, max i32, sum bf16
    std::vector<double> d(count);
    std::vector<int32_t> m(count);
    std::vector<uint16_t> b(count);
    for (size_t i = 0; i < count; ++i) {
      d[i] = double(value(r, i)) * 0.5;
      m[i] = int32_t(i % 13) * (r + 1);
      b[i] = f32_to_bf16_bits(float(r + 1));
    }
    c.all_reduce(s, d.data(), count, CommType::f64, ReduceOp::sum);
    c.all_reduce(s, m.data(), count, CommType::i32, ReduceOp::max);
    c.all_reduce(s, b.data(), count, CommType::bf16, ReduceOp::sum);
    s.synchronize();
    for (size_t i = 0; i < count; ++i) {
      double want = 0;
      for (int p = 0; p < n; ++p) want += double(value(p, i)) * 0.5;
      ASSERT_EQ(d[i], want);
      ASSERT_EQ(m[i], int32_t(i % 13) * n);
      ASSERT_EQ(bf16_bits_to_f32(b[i]), float(n * (n + 1) / 2));
    }
  }
  // broadcast from every root
  for (int root = 0; root < n; ++root) {
    std::vector<uint8_t> buf(333, uint8_t(r == root ? 200 + root : 0));
    c.broadcast(s, buf.data(), buf.size(), CommType::u8, root);
    s.synchronize();
    for (auto x : buf) ASSERT_EQ(x, uint8_t(200 + root));
  }
  c.barrier(s);
  s.synchronize();
}

}  // namespace

TEST(Comm, Collectives) {
  Env& e = env();
  run_collectives(*e.world, *e.stream);
}

TEST(Comm, SubCommunicators) {
  Env& e = env();
  const int n = e.world->size(), r = e.world->rank();
  auto half = e.world->split(r % 2, r);  // even and odd ranks
  EXPECT_EQ(half->size(), (n + 1 - r % 2) / 2);
  EXPECT_EQ(half->rank(), r / 2);
  run_collectives(*half, *e.stream);
  // Keys reverse the order.
  auto rev = e.world->split(0, n - r);
  EXPECT_EQ(rev->rank(), n - 1 - r);
  std::vector<int32_t> got(static_cast<size_t>(n));
  int32_t mine = r;
  rev->all_gather(*e.stream, got.data(), &mine, 1, CommType::i32);
  e.stream->synchronize();
  for (int q = 0; q < n; ++q) EXPECT_EQ(got[size_t(q)], n - 1 - q);
}

TEST(Comm, PointToPointRing) {
  Env& e = env();
  Communicator& c = *e.world;
  const int n = c.size(), r = c.rank();
  if (n == 1) {
    std::vector<float> x(4);
    EXPECT_THROW(c.send(*e.stream, x.data(), 4, CommType::f32, 1, 0), Error);
    return;
  }
  // Sends and receives on separate streams so neither blocks the other.
  auto recv_stream = e.device->make_stream("recv");
  std::vector<float> out(5003), in(5003, -1.f);
  for (size_t i = 0; i < out.size(); ++i) out[i] = value(r, i);
  c.recv(*recv_stream, in.data(), in.size(), CommType::f32, (r + n - 1) % n, 7);
  c.send(*e.stream, out.data(), out.size(), CommType::f32, (r + 1) % n, 7);
  e.stream->synchronize();
  recv_stream->synchronize();
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(in[i], value((r + n - 1) % n, i));
}

TEST(Comm, OverlapsWithOtherStreams) {
  // A collective enqueued on the communication stream does not block the host or another
  // stream: the host returns at once, and a compute stream finishes its own work meanwhile.
  // The collective is queued behind a task that holds the stream until the compute work is done
  // (bounded: 20 s): were the collective to block the host, or to hold the compute stream, the
  // hold would run out first.
  Env& e = env();
  auto compute = e.device->make_stream("compute");
  std::vector<float> send(1 << 16, 1.f), recv(size_t(e.world->size()) << 16);
  std::atomic<bool> release{false}, timed_out{false};
  e.stream->host_task("hold", [&] {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!release.load())
      if (std::chrono::steady_clock::now() > until) {
        timed_out = true;
        return;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
  });
  e.world->all_gather(*e.stream, recv.data(), send.data(), send.size(), CommType::f32);
  std::atomic<int> done{0};
  compute->host_task("work", [&] { done = 1; });
  compute->synchronize();
  EXPECT_EQ(done.load(), 1);
  EXPECT_FALSE(timed_out.load()) << "the collective waited for the hold instead of queueing";
  EXPECT_EQ(recv[0], 0.f) << "the collective ran before the task queued ahead of it";
  release = true;
  e.stream->synchronize();
  for (float x : recv) ASSERT_EQ(x, 1.f);
}

TEST(Mesh, AxesPartitionTheWorld) {
  Env& e = env();
  const int n = e.world->size();
  for (int tp : {1, 2}) {
    if (n % tp) continue;
    Mesh m = make_mesh(*e.world, 0, tp, 1);
    EXPECT_EQ(m.dp * m.tp * m.pp, n);
    EXPECT_EQ(m.dp_comm->size(), m.dp);
    EXPECT_EQ(m.tp_comm->size(), tp);
    EXPECT_EQ(m.dp_comm->rank(), m.dp_index);
    EXPECT_EQ(m.tp_comm->rank(), m.tp_index);
    EXPECT_EQ(e.world->rank(), (m.pp_index * m.dp + m.dp_index) * m.tp + m.tp_index);
    // tp ranks are adjacent world ranks
    int32_t mine = e.world->rank();
    std::vector<int32_t> tps(static_cast<size_t>(tp));
    m.tp_comm->all_gather(*e.stream, tps.data(), &mine, 1, CommType::i32);
    e.stream->synchronize();
    for (int q = 0; q < tp; ++q) EXPECT_EQ(tps[size_t(q)], mine - m.tp_index + q);
  }
  EXPECT_THROW(make_mesh(*e.world, n + 1, 1, 1), Error);
}

// Every rank of these tests runs on this machine: the plan's host checks must count them all,
// and no more (a multi-node job counts each node's ranks only — the names differ there).
TEST(Mesh, RanksOnThisNodeCountsSameHostRanks) {
  Env& e = env();
  EXPECT_EQ(ranks_on_this_node(*e.world, *e.stream), e.world->size());
  // A sub-communicator counts its own members only.
  auto half = e.world->split(e.world->rank() % 2, e.world->rank());
  EXPECT_EQ(ranks_on_this_node(*half, *e.stream), half->size());
}
