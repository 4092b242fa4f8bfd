// optimizer/adamw_cuda.h — the CUDA AdamW kernel's launcher (adamw_cuda.cu; no_adamw_cuda.cpp
// without CUDA). Plain C++. The engine calls adamw_update_on_stream (optimizer/adamw.h), which
// validates and computes the step constants, then calls this.
#pragma once

#include "optimizer/adamw.h"
#include "optimizer/adamw_def.h"

namespace strata {

// Enqueues the update of t (device memory) on `cuda_stream` (a cudaStream_t). t is valid (as
// adamw_update checks it) and t.n > 0. Throws Error if the launch fails.
void adamw_cuda_launch(void* cuda_stream, const AdamWStepConsts& c, const AdamWTensors& t);

}  // namespace strata
