// tests/sanitizers/tsan_canary.cpp — a deliberate race between two CPU-device streams, run only
// in ThreadSanitizer builds: the CTest entry passes when TSan reports it, naming this file.
//
// It proves that the TSan stage still sees strata's own threads: that tsan.supp suppresses no
// strata frame and that holding oneTBB to one thread leaves the stream workers concurrent. It is
// not a unit test of the device (tests/kernels does that) and fails in any other build.
#include <atomic>
#include <cstdio>

#include "kernels/device.h"

int main() {
  auto device = strata::make_device(strata::DeviceKind::cpu);
  auto writer = device->make_stream("writer");
  auto reader = device->make_stream("reader");
  int value = 0;
  int seen = -1;
  // No event orders the two tasks, so the write on one worker and the read on the other race.
  // The relaxed flag only makes the read come second in time; it is no synchronization (TSan
  // sees none either), and waiting for the reader first keeps this thread from passing the
  // writer's progress on to it through the streams' locks.
  std::atomic<bool> written{false};
  writer->host_task("write", [&] {
    value = 1;
    written.store(true, std::memory_order_relaxed);
  });
  reader->host_task("read", [&] {
    while (!written.load(std::memory_order_relaxed)) {
    }
    seen = value;
  });
  reader->synchronize();
  writer->synchronize();
  std::printf("read %d without a race report: ThreadSanitizer missed a race between streams\n", seen);
  return 0;
}
