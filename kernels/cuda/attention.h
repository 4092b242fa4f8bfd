// kernels/cuda/attention.h — launchers of causal grouped-query attention (attention.cu), forward
// (log-sum-exp saved) and backward (probabilities recomputed from it), with the layouts of
// ops.h. Head dims up to kMaxAttentionHeadDim.
#pragma once

namespace strata::cuda {

class CudaStream;

inline constexpr int kMaxAttentionHeadDim = 256;

void launch_attention_fwd(CudaStream& s, float* out, float* lse, const float* q, const float* k,
                          const float* v, int B, int T, int H, int KVH, int D, int ldq, int ldkv);
// dq, dk, dv are written. Uses the stream's scratch (B·H·T floats).
void launch_attention_bwd(CudaStream& s, float* dq, float* dk, float* dv, const float* dout,
                          const float* out, const float* lse, const float* q, const float* k,
                          const float* v, int B, int T, int H, int KVH, int D, int ldq, int ldkv);

}  // namespace strata::cuda
