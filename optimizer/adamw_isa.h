// optimizer/adamw_isa.h — the seam between AdamW's dispatcher (adamw.cpp: validation, ISA
// choice, oneTBB split) and its per-ISA translation units (adamw_scalar.cpp, adamw_avx2.cpp,
// adamw_avx512.cpp), plus the separate-pass kernels the benchmark compares against.
// The engine needs only optimizer/adamw.h; tests and bench/adam_bench.cpp use this header too.
//
// Rule for the ISA translation units: they are compiled with -mavx2 / -mavx512* and must never
// run on a CPU without that ISA, so they define no dynamic initializers and no inline functions
// with external linkage (a linker could keep their copy for the whole program); everything in
// them lives in an unnamed namespace except the constant-initialized kernel table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "optimizer/adamw.h"
#include "optimizer/adamw_def.h"

namespace strata {

struct CpuFeatures;

// One ISA's kernels, each over elements [begin, end) of its arrays, single-threaded.
struct AdamWKernels {
  bool built;  // false: this binary was built without the ISA (the pointers are null)
  // The AdamW step; picks the instantiation for the tensors' dtypes (f32/bf16 grad, f32/bf16
  // state, with or without the bf16 copy).
  void (*update)(const AdamWStepConsts& c, const AdamWTensors& t, size_t begin, size_t end);
  // x ← x · scale (one multiply per element: the unfused gradient-scaling pass).
  void (*scale)(float* x, float scale, size_t begin, size_t end);
  // out ← bf16 round-to-nearest-even of x (the unfused copy pass); n: the whole call's length.
  void (*to_bf16)(const float* x, uint16_t* out, size_t n, size_t begin, size_t end);
  // The streaming bound: reads param, grad, m, v and writes param, m, v (and param_bf16 when
  // given) with the update's loads and stores but no floating-point math — each written array
  // is xor-ed with grad, one integer op. f32 grad and f32 state only.
  void (*stream)(const AdamWTensors& t, size_t begin, size_t end);
};

extern const AdamWKernels kAdamWKernelsScalar;
extern const AdamWKernels kAdamWKernelsAvx2;    // built = false off x86-64 (adamw_no_x86.cpp)
extern const AdamWKernels kAdamWKernelsAvx512;  // built = false off x86-64

// oneTBB split: work is cut at multiples of kAdamWBlockElems elements (a multiple of every
// vector width, so only the last piece has a tail) into pieces of at least kAdamWGrainElems.
// 64K elements move 1.75 MiB in an f32 step, ~70 µs at 25 GB/s — far above a task's ~1 µs
// overhead, and small enough that a thread slowed by other load sheds work to the others.
inline constexpr size_t kAdamWBlockElems = 64;
inline constexpr size_t kAdamWGrainElems = size_t{1} << 16;

// The bf16 copy of the parameters (and the bf16 output of the copy pass) is written with
// non-temporal stores when the call has at least this many elements and the destination is
// aligned to the vector store: such a call moves ≥ 30 MiB, about a last-level cache, so its copy
// would be evicted before anyone reads it, and streaming stores spare the read-for-ownership of
// lines the step never reads (2 of 32 bytes per parameter). The bits are the same either way.
inline constexpr size_t kAdamWNonTemporalElems = size_t{1} << 20;

// The ISA STRATA_ISA=`forced` selects on a CPU with features `cpu` ("" or "auto": the widest
// available). Error for an unknown name or an ISA the CPU or the build lacks — a CPU without
// the ISA never runs its kernels.
AdamIsa adamw_choose_isa(std::string_view forced, const CpuFeatures& cpu);
AdamIsa parse_adam_isa(std::string_view name);   // scalar | avx2 | avx512, else Error
const AdamWKernels& adamw_kernels(AdamIsa isa);  // Error unless adamw_isa_available(isa)

// The separate passes, on the given ISA and split like adamw_update.
void scale_inplace_isa(AdamIsa isa, float* x, size_t n, float scale);
void convert_f32_to_bf16_isa(AdamIsa isa, const float* x, uint16_t* out, size_t n);
void stream_bound_isa(AdamIsa isa, const AdamWTensors& t);

// Error (naming `where`) unless t has a parameter, exactly one gradient and one consistent
// state dtype: the checks adamw_update and adamw_update_on_stream make at the call.
void adamw_check_tensors(const AdamWTensors& t, const char* where);

// The oneTBB thread count adamw_update uses now (the arena's concurrency within the process's
// tbb::global_control limit).
int adamw_threads();

// Calls Kernel<kGradBf16, kStateBf16, kCopyBf16>::run(c, t, begin, end) for t's dtypes. Used by
// the ISA translation units with their own (unnamed-namespace) Kernel.
template <template <bool, bool, bool> class Kernel>
void adamw_run_variant(const AdamWStepConsts& c, const AdamWTensors& t, size_t begin, size_t end) {
  const int variant = (t.grad_bf16 ? 4 : 0) | (t.m_bf16 ? 2 : 0) | (t.param_bf16 ? 1 : 0);
  switch (variant) {
    case 0:
      return Kernel<false, false, false>::run(c, t, begin, end);
    case 1:
      return Kernel<false, false, true>::run(c, t, begin, end);
    case 2:
      return Kernel<false, true, false>::run(c, t, begin, end);
    case 3:
      return Kernel<false, true, true>::run(c, t, begin, end);
    case 4:
      return Kernel<true, false, false>::run(c, t, begin, end);
    case 5:
      return Kernel<true, false, true>::run(c, t, begin, end);
    case 6:
      return Kernel<true, true, false>::run(c, t, begin, end);
    default:
      return Kernel<true, true, true>::run(c, t, begin, end);
  }
}

}  // namespace strata
