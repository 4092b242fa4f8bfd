// kernels/buffer.cpp — Buffer's move and release, and the kind names.
#include "kernels/device.h"

namespace strata {

std::string_view device_kind_name(DeviceKind k) {
  return k == DeviceKind::cpu ? "cpu" : "cuda";
}

std::string_view memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::device: return "device";
    case MemoryKind::host_pinned: return "pinned host";
    case MemoryKind::host: return "host";
  }
  return "?";
}

Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    reset();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    kind_ = o.kind_;
    releaser_ = o.releaser_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
    o.releaser_ = nullptr;
  }
  return *this;
}

void Buffer::reset() noexcept {
  if (ptr_ && releaser_) releaser_->release(ptr_, bytes_, kind_);
  ptr_ = nullptr;
  bytes_ = 0;
  releaser_ = nullptr;
}

}  // namespace strata
