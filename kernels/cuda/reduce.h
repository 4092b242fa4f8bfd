// kernels/cuda/reduce.h — launcher of the reductions (reduce.cu): *out = Σ x or Σ x², over n
// floats, accumulated in double. Deterministic: the partition into blocks depends on n alone and
// partial sums are combined in a fixed order, so equal inputs give equal bits on every run.
#pragma once

#include <cstddef>

namespace strata::cuda {

class CudaStream;

// out: one double in device memory. Uses the stream's scratch for the per-block partial sums.
void launch_sum(CudaStream& s, double* out, const float* x, size_t n, bool squares);

}  // namespace strata::cuda
