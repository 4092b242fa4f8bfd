// tests/gpu/gpu_test_util.h — helpers of the GPU tests: the skip when no CUDA device is present,
// a device with one stream, and copies between std::vector and device memory through pinned
// staging buffers.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/device.h"
#include "kernels/ops.h"

// Skips the test, with the reason, unless this strata has the CUDA backend and sees a device.
#define STRATA_REQUIRE_CUDA()                                                          \
  do {                                                                                 \
    if (::strata::cuda_device_count() == 0)                                            \
      GTEST_SKIP() << "no CUDA device to test on: " << ::strata::cuda_describe();      \
  } while (0)

namespace strata::test {

struct Gpu {
  std::unique_ptr<Device> dev;
  std::unique_ptr<Stream> s;

  explicit Gpu(uint64_t mem_limit_bytes = 0) {
    DeviceOptions o;
    o.mem_limit_bytes = mem_limit_bytes;
    dev = make_device(DeviceKind::cuda, o);
    s = dev->make_stream("test");
  }
  ~Gpu() {
    s.reset();  // streams before their device
    dev.reset();
  }
  Ops& ops() { return dev->ops(); }

  template <class T>
  Buffer upload(const std::vector<T>& v) {
    const size_t bytes = v.size() * sizeof(T);
    Buffer d = dev->alloc(bytes, "test tensor");
    Buffer h = dev->alloc_host(bytes, true, "test staging");
    if (bytes) std::memcpy(h.data(), v.data(), bytes);
    s->copy(d.data(), h.data(), bytes);
    s->synchronize();
    return d;
  }
  template <class T>
  std::vector<T> download(const void* src, size_t n) {
    std::vector<T> v(n);
    Buffer h = dev->alloc_host(n * sizeof(T), true, "test staging");
    s->copy(h.data(), src, n * sizeof(T));
    s->synchronize();
    if (n) std::memcpy(v.data(), h.data(), n * sizeof(T));
    return v;
  }
  template <class T>
  std::vector<T> download(const Buffer& b, size_t n) {
    return download<T>(b.data(), n);
  }
};

template <class T>
T* at(const Buffer& b, size_t offset = 0) {
  return b.as<T>() + offset;
}

}  // namespace strata::test
