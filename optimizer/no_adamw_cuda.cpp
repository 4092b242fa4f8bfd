// optimizer/no_adamw_cuda.cpp — the stub compiled when strata is built without CUDA.
#include "core/error.h"
#include "optimizer/adamw_cuda.h"

namespace strata {

bool adamw_cuda_built() { return false; }

void adamw_cuda_launch(void*, const AdamWStepConsts&, const AdamWTensors&) {
  fail("optimizer::adamw_cuda", "this strata was not built with CUDA",
       "rebuild with the CUDA toolkit installed (-DSTRATA_CUDA=AUTO), or keep optimizer states on "
       "the host");
}

}  // namespace strata
