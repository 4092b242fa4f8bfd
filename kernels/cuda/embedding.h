// kernels/cuda/embedding.h — launchers of the embedding ops (embedding.cu). Both are bit-exact
// with the scalar reference: the forward copies rows; the backward adds each dout row into its
// dwte row in token order, exactly the reference's sequence of f32 additions.
#pragma once

#include <cstdint>

namespace strata::cuda {

class CudaStream;

// out (N, C) = wte[tokens[n]]; a token outside [0, V) is a fault (reported at synchronize()).
void launch_embedding_fwd(CudaStream& s, float* out, const int32_t* tokens, const float* wte, int N,
                          int C, int V);
// dwte (V, C) += scatter of dout (N, C) by tokens; a token outside [0, V) is a fault and its row
// is skipped. Uses the stream's scratch (a stable sort of the tokens).
void launch_embedding_bwd(CudaStream& s, float* dwte, const float* dout, const int32_t* tokens,
                          int N, int C, int V);

}  // namespace strata::cuda
