// bench/comm_bench.cpp — run_comm_bench.
#include "bench/comm_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>

#include "core/cpu.h"
#include "core/error.h"
#include "core/size.h"
#include "comm/comm.h"
#include "kernels/device.h"

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;

enum class Op { all_gather, reduce_scatter, all_reduce };
const char* op_name(Op o) {
  return o == Op::all_gather ? "all_gather" : o == Op::reduce_scatter ? "reduce_scatter" : "all_reduce";
}

// Exact in f32: small integers.
float fill_value(int rank, size_t i) { return float(int(i % 251) + rank); }

struct Buffers {
  std::vector<float> send, recv;
};

// Element counts of the send and receive buffers for an op whose nccl-tests size is `bytes`.
void shape(Op op, uint64_t bytes, int n, size_t& send, size_t& recv) {
  size_t total = std::max<size_t>(size_t(n), bytes / 4 / size_t(n) * size_t(n));
  switch (op) {
    case Op::all_gather: send = total / size_t(n); recv = total; return;
    case Op::reduce_scatter: send = total; recv = total / size_t(n); return;
    case Op::all_reduce: send = total; recv = 0; return;
  }
}

void run_op(Communicator& c, Stream& s, Op op, Buffers& b) {
  switch (op) {
    case Op::all_gather:
      c.all_gather(s, b.recv.data(), b.send.data(), b.send.size(), CommType::f32);
      break;
    case Op::reduce_scatter:
      c.reduce_scatter(s, b.recv.data(), b.send.data(), b.recv.size(), CommType::f32, ReduceOp::sum);
      break;
    case Op::all_reduce:
      c.all_reduce(s, b.send.data(), b.send.size(), CommType::f32, ReduceOp::sum);
      break;
  }
}

void fill(Op op, Buffers& b, int rank) {
  for (size_t i = 0; i < b.send.size(); ++i) b.send[i] = fill_value(rank, i);
  std::fill(b.recv.begin(), b.recv.end(), -1.0f);
  (void)op;
}

uint64_t count_wrong(Op op, const Buffers& b, int rank, int n) {
  uint64_t wrong = 0;
  float rank_sum = float(n * (n - 1) / 2);
  switch (op) {
    case Op::all_gather: {
      size_t cnt = b.send.size();
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < cnt; ++i) wrong += b.recv[size_t(q) * cnt + i] != fill_value(q, i);
      break;
    }
    case Op::reduce_scatter: {
      size_t cnt = b.recv.size();
      for (size_t i = 0; i < cnt; ++i) {
        size_t g = size_t(rank) * cnt + i;
        wrong += b.recv[i] != float(n) * float(int(g % 251)) + rank_sum;
      }
      break;
    }
    case Op::all_reduce:
      for (size_t i = 0; i < b.send.size(); ++i)
        wrong += b.send[i] != float(n) * float(int(i % 251)) + rank_sum;
      break;
  }
  return wrong;
}

double max_over_ranks(Communicator& c, Stream& s, double v) {
  c.all_reduce(s, &v, 1, CommType::f64, ReduceOp::max);
  s.synchronize();
  return v;
}

}  // namespace

nlohmann::json run_comm_bench(Communicator& world, const CommBenchOptions& o) {
  if (o.step_factor < 2) fail("bench::comm", str("--step-factor ", o.step_factor, " must be at least 2"));
  if (o.min_bytes < 4 || o.max_bytes < o.min_bytes)
    fail("bench::comm", str("sizes ", o.min_bytes, "..", o.max_bytes, " are not a valid range"),
         "--min is at least 4 bytes (one float) and --max at least --min");
  // Memory before the first collective: every rank of this machine holds the largest size's
  // send and receive buffers at once (an all-gather's receive is the whole size).
  uint64_t largest = o.min_bytes;
  while (largest <= o.max_bytes / uint64_t(o.step_factor)) largest *= uint64_t(o.step_factor);
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const uint64_t here = local ? uint64_t(std::max(1, std::atoi(local))) : uint64_t(world.size());
  const uint64_t need = (largest / 4 + largest / 4 / uint64_t(world.size()) + 1) * 4 * here;
  if (need + (uint64_t{1} << 30) > available_memory_bytes())
    fail("bench::comm",
         str("--max ", format_bytes(o.max_bytes), " needs ", format_bytes(need), " on this machine (",
             here, " rank(s), send and receive buffers of ", format_bytes(largest), "), and ",
             format_bytes(available_memory_bytes()), " is available"),
         "lower --max");
  auto device = make_device(DeviceKind::cpu);
  auto stream = device->make_stream("comm");
  const int n = world.size(), r = world.rank();
  nlohmann::json rows = nlohmann::json::array();
  uint64_t total_wrong = 0;
  for (Op op : {Op::all_gather, Op::reduce_scatter, Op::all_reduce}) {
    if (op == Op::all_reduce && !o.all_reduce) continue;
    for (uint64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= uint64_t(o.step_factor)) {
      size_t send = 0, recv = 0;
      shape(op, bytes, n, send, recv);
      Buffers b;
      b.send.resize(send);
      b.recv.resize(recv);
      fill(op, b, r);
      run_op(world, *stream, op, b);
      stream->synchronize();
      double wrong = max_over_ranks(world, *stream, double(count_wrong(op, b, r, n)));
      for (int i = 0; i < o.warmup; ++i) run_op(world, *stream, op, b);
      stream->synchronize();
      int iters = o.iters;
      if (iters <= 0) {  // calibrate on one timed call, agreed over ranks
        world.barrier(*stream);
        stream->synchronize();
        auto t0 = Clock::now();
        run_op(world, *stream, op, b);
        stream->synchronize();
        double one = max_over_ranks(world, *stream, std::chrono::duration<double>(Clock::now() - t0).count());
        iters = int(std::clamp(0.2 / std::max(one, 1e-7), 3.0, 1000.0));
      }
      world.barrier(*stream);
      stream->synchronize();
      auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) run_op(world, *stream, op, b);
      stream->synchronize();
      double sec = max_over_ranks(world, *stream, std::chrono::duration<double>(Clock::now() - t0).count()) / iters;
      uint64_t size = op == Op::all_gather ? recv * 4 : send * 4;
      double algbw = double(size) / sec / 1e9;
      double factor = op == Op::all_reduce ? 2.0 * (n - 1) / n : double(n - 1) / n;
      total_wrong += uint64_t(wrong);
      rows.push_back({{"op", op_name(op)},
                      {"size", size},
                      {"count", op == Op::all_gather ? recv : send},
                      {"type", "float"},
                      {"time_us", sec * 1e6},
                      {"algbw", algbw},
                      {"busbw", algbw * factor},
                      {"wrong", uint64_t(wrong)},
                      {"iters", iters}});
    }
  }
  return {{"ranks", n},
          {"backend", world.backend()},
          {"busbw_factors", {{"all_gather", "(n-1)/n"}, {"reduce_scatter", "(n-1)/n"}, {"all_reduce", "2(n-1)/n"}}},
          {"results", rows},
          {"wrong_total", total_wrong}};
}

}  // namespace strata
