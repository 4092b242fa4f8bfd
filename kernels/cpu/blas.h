// kernels/cpu/blas.h — the f32 GEMM of the fast CPU ops: OpenBLAS's sgemm, one single-threaded
// call per block of the output, the blocks run in parallel by oneTBB.
//
// All CPU parallelism in strata is oneTBB; OpenBLAS's own threads would oversubscribe the cores,
// so the first call of anything here sets OpenBLAS to one thread (openblas_set_num_threads(1)).
// The output blocks depend only on the shape (never on the thread count), so results are
// deterministic. Row-major throughout; op(X) is X or X^T.
//
// Example: out (N, OC) = in (N, IC) · w^T, w (OC, IC):
//   blas::gemm(false, true, N, OC, IC, 1.0f, in, IC, w, IC, 0.0f, out, OC);
#pragma once

#include <string>

namespace strata::cpu::blas {

// C (M, N) = alpha · op(A) · op(B) + beta · C, op(A) (M, K), op(B) (K, N); computed in parallel
// over blocks of C. beta = 0 overwrites C (its old contents may be NaN).
void gemm(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc);

// The same as one single-threaded OpenBLAS call on the calling thread (for use inside tasks
// that are already parallel, e.g. per attention head).
void gemm_serial(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc);

// Sets OpenBLAS to one thread, once per process; every function here calls it first.
void init_single_threaded();

// OpenBLAS's own threading, for the benchmark's single-call baseline only: set its thread
// count (restore it to 1 afterwards) and make one plain call.
void set_blas_threads(int threads);
void gemm_blas_threaded(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                        const float* A, int lda, const float* B, int ldb, float beta, float* C,
                        int ldc);

// "OpenBLAS 0.3.21 ... (core Cooperlake)", for benchmark and `strata info` output.
std::string describe();

}  // namespace strata::cpu::blas
