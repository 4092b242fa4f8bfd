// io/aligned_buffer.h — an owner of host memory aligned for O_DIRECT (tests, benchmarks and
// tools; the engine's staging memory comes from the pinned pool). Move-only; zero-filled.
//
// Buffers of 2 MiB or more are placed on transparent huge pages where the kernel allows it
// (aligned to 2 MiB, MADV_HUGEPAGE before the first touch): a 1 MiB transfer then spans one
// physically contiguous segment instead of 256 pages, and the block layer sends the device
// requests of several MiB instead of splitting each at its segment limit (on the virtio disk
// of the development machine this doubled O_DIRECT read throughput; see docs/io.md).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <utility>

namespace strata {

class AlignedBuffer {
 public:
  static constexpr size_t kHugePage = size_t(2) << 20;

  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes, size_t alignment = 4096, bool huge_pages = true)
      : bytes_(bytes) {
    if (huge_pages && bytes >= kHugePage && alignment < kHugePage) alignment = kHugePage;
    size_t rounded = (bytes + alignment - 1) / alignment * alignment;
    if (rounded == 0) rounded = alignment;
    data_ = static_cast<std::byte*>(std::aligned_alloc(alignment, rounded));
    if (!data_) throw std::bad_alloc();
    if (huge_pages && rounded >= kHugePage)
      ::madvise(data_, rounded, MADV_HUGEPAGE);  // a hint; the kernel may refuse it
    std::memset(data_, 0, rounded);
  }
  AlignedBuffer(AlignedBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept {
    if (this != &o) {
      std::free(data_);
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  std::byte* data() const { return data_; }
  size_t size() const { return bytes_; }
  std::span<std::byte> span() const { return {data_, bytes_}; }

 private:
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace strata
