// kernels/cuda/gemm.h — row-major GEMMs through cuBLASLt (gemm.cpp), for the linear ops and the
// bf16 benchmark. Plain C++: no CUDA header.
//
// f32: f32 inputs and output, CUBLAS_COMPUTE_32F restricted to FMA (CUDA-core) algorithms, so
// no TF32 and no tensor-core emulation: results stay close to the CPU reference. f32_bf16: f32
// inputs and output, the inputs rounded to bf16 inside cuBLASLt and multiplied on the tensor
// cores with f32 accumulation (CUBLAS_COMPUTE_32F_FAST_16BF: what a bf16 mixed-precision GEMM
// computes, without bf16 copies of the operands). bf16: bf16 inputs and output, f32 accumulation
// (CUBLAS_COMPUTE_32F). The algorithm is cuBLASLt's first heuristic choice for the shape and the
// pointers' alignment (cached per device), so a call with the same shapes and alignments always
// runs the same algorithm: bit-reproducible.
// Not here: batched or strided GEMMs (attention has its own kernels), epilogues.
#pragma once

#include <cstdint>

namespace strata::cuda {

class CudaStream;
struct GemmCache;  // per-device cache of cuBLASLt descriptors and heuristic results

GemmCache* gemm_cache_create();
void gemm_cache_destroy(GemmCache* cache) noexcept;

enum class GemmType { f32, f32_bf16, bf16 };

// Row-major C (m, n) = op(A) (m, k) · op(B) (k, n) + beta · C, op(X) = X^T when trans_x; A is
// (m, k) or, transposed, (k, m) with rows lda elements apart; likewise B and C. beta is 0
// (C written) or 1 (C accumulates). candidate: which of cuBLASLt's heuristic results to run —
// 0, its first choice, is what strata runs; the others exist for benchmarks. Enqueued on s.
void gemm(CudaStream& s, GemmType type, bool trans_a, bool trans_b, int m, int n, int k,
          const void* a, int64_t lda, const void* b, int64_t ldb, float beta, void* c,
          int64_t ldc, int candidate = 0);

// How many heuristic candidates cuBLASLt offers for that call (at least 1; Error if none).
int gemm_candidates(CudaStream& s, GemmType type, bool trans_a, bool trans_b, int m, int n, int k,
                    const void* a, int64_t lda, const void* b, int64_t ldb, const void* c,
                    int64_t ldc);

}  // namespace strata::cuda
