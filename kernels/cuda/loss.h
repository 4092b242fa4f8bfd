// kernels/cuda/loss.h — launchers of softmax cross-entropy (loss.cu), forward and backward, as
// in ops.h. Log-sum-exp in double, as the scalar reference computes it.
#pragma once

#include <cstdint>

namespace strata::cuda {

class CudaStream;

// A target ≥ V is a fault (reported at synchronize()); its loss is 0.
void launch_cross_entropy_fwd(CudaStream& s, float* losses, const float* logits,
                              const int32_t* targets, int N, int V);
// dlogits may be logits (in place). A target ≥ V is a fault; its row is zeroed.
void launch_cross_entropy_bwd(CudaStream& s, float* dlogits, const float* logits,
                              const int32_t* targets, float dloss, int N, int V);

}  // namespace strata::cuda
