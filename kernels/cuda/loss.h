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

// Vocabulary-parallel cross-entropy in three steps (kernels/ops.h): part statistics, their
// combination from every part (stats_all (P, N, 2)), and the part's backward from the combined lse.
void launch_cross_entropy_part_fwd(CudaStream& s, float* stats, const float* logits,
                                   const int32_t* targets, int N, int Vp, int col_begin, int V);
void launch_cross_entropy_combine(CudaStream& s, float* losses, float* lse, const float* stats_all,
                                  const int32_t* targets, int N, int P);
void launch_cross_entropy_part_bwd(CudaStream& s, float* dlogits, const float* logits,
                                   const float* lse, const int32_t* targets, float dloss, int N,
                                   int Vp, int col_begin, int V);

}  // namespace strata::cuda
