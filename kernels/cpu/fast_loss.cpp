// kernels/cpu/fast_loss.cpp — fast softmax cross-entropy, forward and backward, one row per
// logits vector: max, then Σ exp(x − max) (f32 blocks summed in double), then (backward) one
// write pass.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/fast_common.h"
#include "kernels/cpu/fast_ops.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::fast {
namespace {

constexpr int64_t kLossElemsPerTask = 1 << 14;  // ~16K logits per task, whatever V is

int64_t rows_per_task(int V) { return std::max<int64_t>(1, kLossElemsPerTask / std::max(1, V)); }

// log Σ_j exp(row[j]): max subtraction, then the exponentials summed in f32 SIMD lanes over
// blocks of kExpBlock logits and the block sums added in double (V can be 10^5): relative error
// of the sum ≤ (kExpBlock/8 + 3)·u. (A double accumulator inside the loop would keep GCC from
// vectorizing the exponentials.)
constexpr int kExpBlock = 256;

float row_logsumexp(const float* __restrict row, int V) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int j = 0; j < V; ++j) m = std::max(m, row[j]);
  double z = 0.0;
  for (int j0 = 0; j0 < V; j0 += kExpBlock) {
    const int j1 = std::min(V, j0 + kExpBlock);
    float zb = 0.0f;
#pragma omp simd reduction(+ : zb)
    for (int j = j0; j < j1; ++j) zb += exp_fast(row[j] - m);
    z += zb;
  }
  return m + float(std::log(z));
}

void check_targets(const char* op, const int32_t* targets, int N, int V) {
  for (int n = 0; n < N; ++n)
    if (targets[n] >= V) fail_index(op, "target", n, targets[n], V);
}

// One row of the backward: drow = (exp(row − lse) − onehot(jt)) · dloss over its V columns; jt
// outside [0, V) subtracts nothing (the target lies in another vocabulary part). In place allowed.
void softmax_grad_row(float* drow, const float* row, int V, float lse, float dloss, int64_t jt) {
#pragma omp simd
  for (int j = 0; j < V; ++j) drow[j] = exp_fast(row[j] - lse) * dloss;
  if (jt >= 0 && jt < V) drow[jt] -= dloss;
}

}  // namespace

// losses[n] = logsumexp(logits[n]) − logits[n, t]; t < 0: 0.
void cross_entropy_fwd(float* losses, const float* logits, const int32_t* targets, int N, int V) {
  check_dims("cross_entropy_fwd", N, V);
  check_targets("cross_entropy_fwd", targets, N, V);
  parallel_rows(N, rows_per_task(V), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int32_t t = targets[n];
      const float* row = logits + n * V;
      losses[n] = t < 0 ? 0.0f : row_logsumexp(row, V) - row[t];
    }
  });
}

// dlogits = (softmax − onehot(t)) · dloss; t < 0: zeros. In place allowed (same index only).
void cross_entropy_bwd(float* dlogits, const float* logits, const int32_t* targets, float dloss,
                       int N, int V) {
  check_dims("cross_entropy_bwd", N, V);
  check_targets("cross_entropy_bwd", targets, N, V);
  parallel_rows(N, rows_per_task(V), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int32_t t = targets[n];
      const float* row = logits + n * V;
      float* drow = dlogits + n * V;
      if (t < 0) {
        std::fill(drow, drow + V, 0.0f);
        continue;
      }
      softmax_grad_row(drow, row, V, row_logsumexp(row, V), dloss, t);
    }
  });
}

// Vocabulary-parallel parts (kernels/ops.h): stats (N, 2) = {lse of this part's row, the
// target's logit when this part holds it, else 0}.
void cross_entropy_part_fwd(float* stats, const float* logits, const int32_t* targets, int N,
                            int Vp, int col_begin, int V) {
  check_dims("cross_entropy_part_fwd", N, Vp);
  check_vocab_part("cross_entropy_part_fwd", V, col_begin, Vp);
  check_targets("cross_entropy_part_fwd", targets, N, V);
  parallel_rows(N, rows_per_task(Vp), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int32_t t = targets[n];
      const float* row = logits + n * Vp;
      const int64_t j = int64_t(t) - col_begin;
      stats[2 * n] = t < 0 ? 0.0f : row_logsumexp(row, Vp);
      stats[2 * n + 1] = (t >= 0 && j >= 0 && j < Vp) ? row[j] : 0.0f;
    }
  });
}

// lse = log Σ_p exp(part lse) in double from the largest; loss = lse − Σ_p target logits.
void cross_entropy_combine(float* losses, float* lse, const float* stats_all,
                           const int32_t* targets, int N, int P) {
  check_dims("cross_entropy_combine", N, P);
  if (P < 1) fail("cpu::cross_entropy_combine", str("P=", P, " parts; at least one is needed"));
  parallel_rows(N, 4096, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      if (targets[n] < 0) {
        losses[n] = lse[n] = 0.0f;
        continue;
      }
      double m = -std::numeric_limits<double>::infinity(), target = 0, z = 0;
      for (int p = 0; p < P; ++p) m = std::max(m, double(stats_all[(int64_t(p) * N + n) * 2]));
      for (int p = 0; p < P; ++p) {
        z += std::exp(double(stats_all[(int64_t(p) * N + n) * 2]) - m);
        target += double(stats_all[(int64_t(p) * N + n) * 2 + 1]);
      }
      const double l = m + std::log(z);
      lse[n] = float(l);
      losses[n] = float(l - target);
    }
  });
}

// dlogits = (exp(logits − lse) − onehot) · dloss over this part's columns; in place allowed.
void cross_entropy_part_bwd(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int N, int Vp, int col_begin,
                            int V) {
  check_dims("cross_entropy_part_bwd", N, Vp);
  check_vocab_part("cross_entropy_part_bwd", V, col_begin, Vp);
  check_targets("cross_entropy_part_bwd", targets, N, V);
  parallel_rows(N, rows_per_task(Vp), [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int32_t t = targets[n];
      const float* row = logits + n * Vp;
      float* drow = dlogits + n * Vp;
      if (t < 0) {
        std::fill(drow, drow + Vp, 0.0f);
        continue;
      }
      softmax_grad_row(drow, row, Vp, lse[n], dloss, int64_t(t) - col_begin);
    }
  });
}

}  // namespace strata::cpu::fast
