// kernels/cuda/rope.h — launcher of the rotary embedding (rope.cu), forward (sign +1) and
// backward (sign −1, the transpose rotation), in place, with the (T, D/2) cos/sin tables in
// device memory, as ops.h defines them.
#pragma once

namespace strata::cuda {

class CudaStream;

void launch_rope(CudaStream& s, float* x, const float* cos, const float* sin, int B, int T,
                 int n_heads, int D, int ld, bool inverse);

}  // namespace strata::cuda
