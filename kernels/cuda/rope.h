// kernels/cuda/rope.h — launcher of the rotary embedding (rope.cu), forward (sign +1) and
// backward (sign −1, the transpose rotation), in place, as ops.h defines them.
#pragma once

namespace strata::cuda {

class CudaStream;

void launch_rope(CudaStream& s, float* x, int B, int T, int n_heads, int D, int ld, float theta,
                 bool inverse);

}  // namespace strata::cuda
