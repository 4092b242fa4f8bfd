// kernels/cpu/blas.cpp — sgemm through OpenBLAS (single-threaded calls) with the parallelism
// done by oneTBB over blocks of the output. See blas.h.
#include "kernels/cpu/blas.h"

#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/partitioner.h>

#include <algorithm>
#include <mutex>

#include "core/cpu.h"
#include "core/error.h"

namespace strata::cpu::blas {
namespace {

// Output blocks: start at kBlockM × kBlockN and halve the larger side while there are fewer
// blocks than min_blocks() and the side stays ≥ kMinBlockSide. 256 rows × 1024 columns keeps
// OpenBLAS near its single-core peak: it packs its A and B panels once per call, so blocks much
// smaller than this (e.g. 256 × 256 at K = 2048) spend ~10% of the time re-packing; rows are
// split first because the weight-gradient GEMMs (op(A) = A^T) prefer 256-row blocks. The
// block count scales with the machine (4 per hardware thread, at least 8) for load balance,
// yet depends only on the shape and the machine, never on the arena or the scheduling, so a
// result is the same whatever thread count a caller runs with.
constexpr int kBlockM = 256;
constexpr int kBlockN = 1024;
constexpr int kMinBlockSide = 64;
constexpr int kBlocksPerThread = 4;
constexpr int kMinBlocksFloor = 8;

int64_t min_blocks() {
  static const int64_t n =
      std::max<int64_t>(kMinBlocksFloor, int64_t(kBlocksPerThread) * hardware_threads());
  return n;
}

// Below this many multiply-adds one call is cheaper than spreading the work.
constexpr double kSerialMacs = 1 << 20;

std::once_flag g_init;

void check_shape(int M, int N, int K, int lda, int ldb, int ldc, bool ta, bool tb) {
  if (M < 0 || N < 0 || K < 0) fail("cpu::gemm", str("negative shape: M=", M, " N=", N, " K=", K));
  if (lda < std::max(1, ta ? M : K) || ldb < std::max(1, tb ? K : N) || ldc < std::max(1, N))
    fail("cpu::gemm", str("leading dimension too small: lda=", lda, " ldb=", ldb, " ldc=", ldc,
                          " for M=", M, " N=", N, " K=", K));
}

void call_sgemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                const float* B, int ldb, float beta, float* C, int ldc) {
  if (M == 0 || N == 0) return;
  if (K == 0) {  // C = beta·C; BLAS would do the same but some builds skip beta = 0 NaN cleanup
    for (int i = 0; i < M; ++i)
      for (int j = 0; j < N; ++j) {
        float& c = C[size_t(i) * ldc + j];
        c = beta == 0.0f ? 0.0f : beta * c;
      }
    return;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
              K, alpha, A, lda, B, ldb, beta, C, ldc);
}

}  // namespace

void init_single_threaded() {
  std::call_once(g_init, [] { openblas_set_num_threads(1); });
}

void gemm_serial(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  init_single_threaded();
  check_shape(M, N, K, lda, ldb, ldc, ta, tb);
  call_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

void gemm(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
          const float* B, int ldb, float beta, float* C, int ldc) {
  init_single_threaded();
  check_shape(M, N, K, lda, ldb, ldc, ta, tb);
  if (M == 0 || N == 0) return;
  if (double(M) * N * K <= kSerialMacs) {
    call_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  int mb = std::min(M, kBlockM), nb = std::min(N, kBlockN);
  auto blocks = [&] { return int64_t((M + mb - 1) / mb) * ((N + nb - 1) / nb); };
  while (blocks() < min_blocks() && (mb > kMinBlockSide || nb > kMinBlockSide)) {
    if (mb >= nb && mb > kMinBlockSide)
      mb = std::max(kMinBlockSide, (mb + 1) / 2);
    else if (nb > kMinBlockSide)
      nb = std::max(kMinBlockSide, (nb + 1) / 2);
    else
      mb = std::max(kMinBlockSide, (mb + 1) / 2);
  }
  const int bm = (M + mb - 1) / mb, bn = (N + nb - 1) / nb;
  tbb::parallel_for(
      tbb::blocked_range<int>(0, bm * bn, 1),
      [&](const tbb::blocked_range<int>& r) {
        for (int blk = r.begin(); blk < r.end(); ++blk) {
          const int i0 = (blk / bn) * mb, j0 = (blk % bn) * nb;
          const int m = std::min(mb, M - i0), n = std::min(nb, N - j0);
          // op(A) rows i0.. : A row i0 (no trans) or A column i0 (trans).
          const float* a = ta ? A + i0 : A + size_t(i0) * lda;
          // op(B) columns j0.. : B column j0 (no trans) or B row j0 (trans).
          const float* b = tb ? B + size_t(j0) * ldb : B + j0;
          call_sgemm(ta, tb, m, n, K, alpha, a, lda, b, ldb, beta, C + size_t(i0) * ldc + j0, ldc);
        }
      },
      tbb::simple_partitioner());
}

void set_blas_threads(int threads) {
  init_single_threaded();
  openblas_set_num_threads(std::max(1, threads));
}

void gemm_blas_threaded(bool ta, bool tb, int M, int N, int K, float alpha, const float* A, int lda,
                        const float* B, int ldb, float beta, float* C, int ldc) {
  check_shape(M, N, K, lda, ldb, ldc, ta, tb);
  call_sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

std::string describe() {
  const char* config = openblas_get_config();
  const char* core = openblas_get_corename();
  return str(config ? config : "OpenBLAS", " (core ", core ? core : "?", ")");
}

}  // namespace strata::cpu::blas
