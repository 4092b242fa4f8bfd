// engine/test_hooks.h — hooks for tests: I/O faults injected beneath the NVMe swap and the
// checkpoint files, a callback at each phase of a checkpoint save, before each step, before
// each unit's optimizer update, after each gradient reduction, acquire and computed forward, and
// a forced CPU AdamW path.
// Tests and apps/strata's STRATA_FAULT (tests/cli) include this header and hand a TestHooks to
// TrainerOptions::test_hooks, the one entry point; the trainer passes it on to the ZeRO engine
// and the checkpoint writer.
//
// Public headers only name the type, so they do not see io/fault_backend.h. A real run has no
// hooks (a null pointer) and none of this changes a number when the hooks are empty.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "io/fault_backend.h"
#include "optimizer/adamw.h"

namespace strata {

class FileIO;
struct IoOptions;

struct TestHooks {
  std::optional<AdamIsa> adam_isa;  // force a CPU AdamW path; default: the active one
  // Faults injected into the NVMe swap's I/O and into the checkpoint files' (the POSIX backend
  // under io/fault_backend.h's injector).
  std::vector<FaultRule> io_faults;
  std::vector<FaultRule> checkpoint_io_faults;
  // Called at each phase of a checkpoint save ("shard" half-way through a rank file, "written"
  // once its writes have completed, before its fsync; "manifest" before the manifest is
  // written, "rename" before step_N.tmp is renamed, "latest" before `latest` moves, "prune"
  // once an old checkpoint is renamed step_K.tmp, before its removal) with the step being saved.
  // Empty: nothing.
  std::function<void(const char* phase, int64_t step)> checkpoint_hook;
  // Called on every rank before each step's first collective (a rank that hangs or fails).
  std::function<void(int64_t step)> before_step;
  // Called before the optimizer updates unit u — on the step's worker thread when the step is
  // overlapped (offload.overlap_optimizer), else on the engine's thread (e.g. a slow update).
  std::function<void(int unit)> before_unit_update;
  // Called on the engine's thread once reduce_grad(u) has enqueued unit u's gradient reduction
  // (every backward pass; an unclipped step's update of u may start from then on).
  std::function<void(int unit)> after_reduce_grad;
  // Called on the engine's thread when a pass has acquired unit u's parameters, about to
  // return them to the compute of u.
  std::function<void(int unit)> after_acquire;
  // Called on the compute stream (its thread on the CPU device) once unit u's forward has run
  // there — the point the device reaches, not the point the engine's thread enqueued it — with
  // the parameters that forward read: the unit's flat layout (layout.numel() elements, f32;
  // with bf16 precision the compute copy widened). Device memory: readable here on the CPU
  // device only. Valid for the call.
  std::function<void(int unit, std::span<const float> params)> after_forward;
  // Called on an overlapped step's worker thread each time it submits the NVMe read of one chunk
  // of unit's optimizer states ahead of their update (offload.optimizer_read_ahead), with the
  // chunk's bytes (master, m and v).
  std::function<void(int unit, uint64_t bytes)> after_read_ahead;
};

// ---- for the engine's own use ----

// make_file_io(io, dirs), or — when `faults` is given and not empty — the POSIX backend under a
// fault injector (io/fault_backend.h).
std::unique_ptr<FileIO> make_file_io_with_faults(const IoOptions& io,
                                                 const std::vector<std::string>& dirs,
                                                 const std::vector<FaultRule>* faults);
// hooks->checkpoint_hook(phase, step) when hooks has one.
void run_checkpoint_hook(const TestHooks* hooks, const char* phase, int64_t step);

}  // namespace strata
