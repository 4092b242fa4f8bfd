// engine/test_hooks.cpp — where the engine applies engine/test_hooks.h: the FileIO of a tier or of
// the checkpoint files under injected faults, and the checkpoint phase callback.
#include "engine/test_hooks.h"

#include <utility>

#include "io/backend.h"
#include "io/file_io.h"

namespace strata {

std::unique_ptr<FileIO> make_file_io_with_faults(const IoOptions& io,
                                                 const std::vector<std::string>& dirs,
                                                 const std::vector<FaultRule>* faults) {
  if (!faults || faults->empty()) return make_file_io(io, dirs);
  auto backend = make_fault_backend(make_posix_backend(io.queue_depth), *faults);
  return std::make_unique<FileIO>(std::move(backend), io);
}

void run_checkpoint_hook(const TestHooks* hooks, const char* phase, int64_t step) {
  if (hooks && hooks->checkpoint_hook) hooks->checkpoint_hook(phase, step);
}

}  // namespace strata
