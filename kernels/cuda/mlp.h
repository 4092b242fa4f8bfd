// kernels/cuda/mlp.h — launchers of SwiGLU (mlp.cu), forward and backward, as in ops.h. The math
// is the scalar reference's, in double, rounded once to float.
#pragma once

namespace strata::cuda {

class CudaStream;

void launch_swiglu_fwd(CudaStream& s, float* out, const float* gate, const float* up, int N, int F,
                       int ld);
void launch_swiglu_bwd(CudaStream& s, float* dgate, float* dup, const float* dout,
                       const float* gate, const float* up, int N, int F, int ld);

}  // namespace strata::cuda
