// kernels/cuda/embedding.h — launchers of the embedding ops (embedding.cu). Both are bit-exact
// with the scalar reference: the forward copies rows; the backward adds each dout row into its
// dwte row in token order, exactly the reference's sequence of f32 additions.
#pragma once

#include <cstdint>

namespace strata::cuda {

class CudaStream;

// wte holds rows [row_begin, row_begin + rows) of the (V, C) table (the whole table: 0, V).
// out (N, C) = the token's row, or zeros when another part holds it; a token outside [0, V) is a
// fault (reported at synchronize()).
void launch_embedding_fwd(CudaStream& s, float* out, const int32_t* tokens, const float* wte, int N,
                          int C, int V, int row_begin, int rows);
// dwte (rows, C) += scatter of the dout (N, C) rows whose token this part holds; a token outside
// [0, V) is a fault and its row is skipped. Uses the stream's scratch (a stable sort of the tokens).
void launch_embedding_bwd(CudaStream& s, float* dwte, const float* dout, const int32_t* tokens,
                          int N, int C, int V, int row_begin, int rows);

}  // namespace strata::cuda
