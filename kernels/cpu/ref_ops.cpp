// kernels/cpu/ref_ops.cpp — the scalar reference ops (see ref_ops.h). One loop nest per formula,
// sums in double, no cleverness: when a fast path and this file disagree, this file is right.
#include "kernels/cpu/ref_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::ref {

using Acc = double;  // every reduction accumulates in double

// ---- embedding ------------------------------------------------------------------------------

template <class Real>
void embedding_part_fwd(Real* out, const int32_t* tokens, const Real* wte_part, int N, int C, int V,
                        int row_begin, int rows) {
  check_dims("embedding_fwd", N, C);
  check_vocab_part("embedding_fwd", V, row_begin, rows);
  for (int n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= V) fail_index("embedding_fwd", "token", n, tokens[n], V);
    const int64_t r = int64_t(tokens[n]) - row_begin;
    for (int c = 0; c < C; ++c)
      out[size_t(n) * C + c] = (r >= 0 && r < rows) ? wte_part[size_t(r) * C + c] : Real(0);
  }
}

template <class Real>
void embedding_part_bwd(Real* dwte_part, const Real* dout, const int32_t* tokens, int N, int C,
                        int V, int row_begin, int rows) {
  check_dims("embedding_bwd", N, C);
  check_vocab_part("embedding_bwd", V, row_begin, rows);
  for (int n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= V) fail_index("embedding_bwd", "token", n, tokens[n], V);
    const int64_t r = int64_t(tokens[n]) - row_begin;
    if (r < 0 || r >= rows) continue;
    for (int c = 0; c < C; ++c) dwte_part[size_t(r) * C + c] += dout[size_t(n) * C + c];
  }
}

template <class Real>
void embedding_fwd(Real* out, const int32_t* tokens, const Real* wte, int N, int C, int V) {
  embedding_part_fwd(out, tokens, wte, N, C, V, 0, V);
}

template <class Real>
void embedding_bwd(Real* dwte, const Real* dout, const int32_t* tokens, int N, int C, int V) {
  embedding_part_bwd(dwte, dout, tokens, N, C, V, 0, V);
}

// ---- RMSNorm --------------------------------------------------------------------------------

template <class Real>
void rmsnorm_fwd(Real* out, Real* rstd, const Real* x, const Real* w, int N, int C, Real eps) {
  check_dims("rmsnorm_fwd", N, C);
  for (int n = 0; n < N; ++n) {
    const Real* xr = x + size_t(n) * C;
    Acc ss = 0;
    for (int c = 0; c < C; ++c) ss += Acc(xr[c]) * Acc(xr[c]);
    Real r = Real(1.0 / std::sqrt(ss / C + Acc(eps)));
    rstd[n] = r;
    for (int c = 0; c < C; ++c) {
      Real y = xr[c] * r;  // normalized in the working precision, then the weight (HF order)
      out[size_t(n) * C + c] = y * w[c];
    }
  }
}

template <class Real>
void rmsnorm_bwd(Real* dx, Real* dw, const Real* dout, const Real* x, const Real* w,
                 const Real* rstd, int N, int C) {
  check_dims("rmsnorm_bwd", N, C);
  for (int n = 0; n < N; ++n) {
    const Real* xr = x + size_t(n) * C;
    const Real* gr = dout + size_t(n) * C;
    Acc r = rstd[n];
    Acc dot = 0;  // Σ_c w·dout·y
    for (int c = 0; c < C; ++c) dot += Acc(w[c]) * Acc(gr[c]) * (Acc(xr[c]) * r);
    Acc mean_dot = C > 0 ? dot / C : 0.0;
    for (int c = 0; c < C; ++c) {
      Acc y = Acc(xr[c]) * r;
      dw[c] += Real(Acc(gr[c]) * y);
      dx[size_t(n) * C + c] += Real(r * (Acc(w[c]) * Acc(gr[c]) - y * mean_dot));
    }
  }
}

// ---- linear ---------------------------------------------------------------------------------

template <class Real>
void linear_fwd(Real* out, const Real* in, const Real* w, int N, int IC, int OC) {
  check_dims("linear_fwd", N, IC);
  check_dims("linear_fwd", N, OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      Acc s = 0;
      for (int i = 0; i < IC; ++i) s += Acc(in[size_t(n) * IC + i]) * Acc(w[size_t(o) * IC + i]);
      out[size_t(n) * OC + o] = Real(s);
    }
}

template <class Real>
void linear_bwd(Real* din, Real* dw, const Real* dout, const Real* in, const Real* w, int N, int IC,
                int OC) {
  check_dims("linear_bwd", N, IC);
  check_dims("linear_bwd", N, OC);
  if (din)
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < IC; ++i) {
        Acc s = 0;
        for (int o = 0; o < OC; ++o)
          s += Acc(dout[size_t(n) * OC + o]) * Acc(w[size_t(o) * IC + i]);
        din[size_t(n) * IC + i] = Real(s);
      }
  for (int o = 0; o < OC; ++o)
    for (int i = 0; i < IC; ++i) {
      Acc s = 0;
      for (int n = 0; n < N; ++n) s += Acc(dout[size_t(n) * OC + o]) * Acc(in[size_t(n) * IC + i]);
      dw[size_t(o) * IC + i] += Real(s);
    }
}

// ---- rotary embedding -----------------------------------------------------------------------

// sign = +1: the rotation by the tables' angle (forward); sign = -1: its transpose (backward).
template <class Real>
static void rope_rotate(Real* x, const Real* cos, const Real* sin, int B, int T, int n_heads,
                        int D, int ld, double sign) {
  const int half = D / 2;
  for (int row = 0; row < B * T; ++row) {
    const int t = row % T;
    for (int h = 0; h < n_heads; ++h) {
      Real* xh = x + size_t(row) * ld + size_t(h) * D;
      for (int i = 0; i < half; ++i) {
        double c = cos[size_t(t) * half + i], s = sign * double(sin[size_t(t) * half + i]);
        double a = xh[i], b = xh[i + half];
        xh[i] = Real(a * c - b * s);
        xh[i + half] = Real(b * c + a * s);
      }
    }
  }
}

template <class Real>
void rope_fwd(Real* x, const Real* cos, const Real* sin, int B, int T, int n_heads, int D, int ld) {
  check_rope("rope_fwd", cos, sin, B, T, n_heads, D, ld);
  rope_rotate(x, cos, sin, B, T, n_heads, D, ld, +1.0);
}

template <class Real>
void rope_bwd(Real* dx, const Real* cos, const Real* sin, int B, int T, int n_heads, int D,
              int ld) {
  check_rope("rope_bwd", cos, sin, B, T, n_heads, D, ld);
  rope_rotate(dx, cos, sin, B, T, n_heads, D, ld, -1.0);
}

// ---- attention ------------------------------------------------------------------------------

template <class Real>
void attention_fwd(Real* out, Real* lse, const Real* q, const Real* k, const Real* v, int B, int T,
                   int H, int KVH, int D, int ldq, int ldkv) {
  check_attention("attention_fwd", B, T, H, KVH, D, ldq, ldkv);
  const int group = H / KVH;
  const Acc scale = 1.0 / std::sqrt(Acc(D));
  std::vector<Acc> s(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      for (int t = 0; t < T; ++t) {
        const Real* qt = q + size_t(b * T + t) * ldq + size_t(h) * D;
        Acc m = -std::numeric_limits<Acc>::infinity();
        for (int j = 0; j <= t; ++j) {
          const Real* kj = k + size_t(b * T + j) * ldkv + size_t(g) * D;
          Acc dot = 0;
          for (int d = 0; d < D; ++d) dot += Acc(qt[d]) * Acc(kj[d]);
          s[j] = dot * scale;
          if (s[j] > m) m = s[j];
        }
        Acc z = 0;
        for (int j = 0; j <= t; ++j) z += std::exp(s[j] - m);
        const Acc l = m + std::log(z);
        lse[size_t(b * H + h) * T + t] = Real(l);
        Real* ot = out + size_t(b * T + t) * H * D + size_t(h) * D;
        for (int d = 0; d < D; ++d) {
          Acc o = 0;
          for (int j = 0; j <= t; ++j)
            o += std::exp(s[j] - l) * Acc(v[size_t(b * T + j) * ldkv + size_t(g) * D + d]);
          ot[d] = Real(o);
        }
      }
    }
}

template <class Real>
void attention_bwd(Real* dq, Real* dk, Real* dv, const Real* dout, const Real* out, const Real* lse,
                   const Real* q, const Real* k, const Real* v, int B, int T, int H, int KVH, int D,
                   int ldq, int ldkv) {
  check_attention("attention_bwd", B, T, H, KVH, D, ldq, ldkv);
  (void)out;  // the reference recomputes Σ p·dp directly; the fast path uses dout·out instead
  const int group = H / KVH;
  const Acc scale = 1.0 / std::sqrt(Acc(D));
  // dk, dv are written: accumulate in double, then store.
  std::vector<Acc> dk_acc(size_t(B) * T * KVH * D, 0.0), dv_acc(size_t(B) * T * KVH * D, 0.0);
  auto kv_index = [&](int b, int j, int g, int d) { return (size_t(b * T + j) * KVH + g) * D + d; };
  std::vector<Acc> p(T), dp(T);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < H; ++h) {
      const int g = h / group;
      for (int t = 0; t < T; ++t) {
        const Real* qt = q + size_t(b * T + t) * ldq + size_t(h) * D;
        const Real* dot_ = dout + size_t(b * T + t) * H * D + size_t(h) * D;
        const Acc l = lse[size_t(b * H + h) * T + t];
        Acc p_dp = 0;
        for (int j = 0; j <= t; ++j) {
          const Real* kj = k + size_t(b * T + j) * ldkv + size_t(g) * D;
          const Real* vj = v + size_t(b * T + j) * ldkv + size_t(g) * D;
          Acc s = 0, dpj = 0;
          for (int d = 0; d < D; ++d) {
            s += Acc(qt[d]) * Acc(kj[d]);
            dpj += Acc(dot_[d]) * Acc(vj[d]);
          }
          p[j] = std::exp(s * scale - l);
          dp[j] = dpj;
          p_dp += p[j] * dpj;
        }
        Real* dqt = dq + size_t(b * T + t) * ldq + size_t(h) * D;
        for (int d = 0; d < D; ++d) {
          Acc acc = 0;
          for (int j = 0; j <= t; ++j) {
            const Acc ds = p[j] * (dp[j] - p_dp);
            acc += ds * Acc(k[size_t(b * T + j) * ldkv + size_t(g) * D + d]) * scale;
            dk_acc[kv_index(b, j, g, d)] += ds * Acc(qt[d]) * scale;
            dv_acc[kv_index(b, j, g, d)] += p[j] * Acc(dot_[d]);
          }
          dqt[d] = Real(acc);
        }
      }
    }
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < T; ++j)
      for (int g = 0; g < KVH; ++g)
        for (int d = 0; d < D; ++d) {
          dk[size_t(b * T + j) * ldkv + size_t(g) * D + d] = Real(dk_acc[kv_index(b, j, g, d)]);
          dv[size_t(b * T + j) * ldkv + size_t(g) * D + d] = Real(dv_acc[kv_index(b, j, g, d)]);
        }
}

// ---- SwiGLU ---------------------------------------------------------------------------------

template <class Real>
void swiglu_fwd(Real* out, const Real* gate, const Real* up, int N, int F, int ld) {
  check_strided("swiglu_fwd", N, F, ld);
  for (int n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f) {
      double g = gate[size_t(n) * ld + f], u = up[size_t(n) * ld + f];
      out[size_t(n) * F + f] = Real(g / (1.0 + std::exp(-g)) * u);
    }
}

template <class Real>
void swiglu_bwd(Real* dgate, Real* dup, const Real* dout, const Real* gate, const Real* up, int N,
                int F, int ld) {
  check_strided("swiglu_bwd", N, F, ld);
  for (int n = 0; n < N; ++n)
    for (int f = 0; f < F; ++f) {
      const size_t i = size_t(n) * ld + f;
      double g = gate[i], u = up[i], d = dout[size_t(n) * F + f];
      double s = 1.0 / (1.0 + std::exp(-g));
      dgate[i] = Real(d * u * s * (1.0 + g * (1.0 - s)));
      dup[i] = Real(d * g * s);
    }
}

// ---- cross-entropy --------------------------------------------------------------------------

template <class Real>
static Acc row_logsumexp(const Real* row, int V) {
  Acc m = -std::numeric_limits<Acc>::infinity();
  for (int j = 0; j < V; ++j) m = std::max(m, Acc(row[j]));
  Acc z = 0;
  for (int j = 0; j < V; ++j) z += std::exp(Acc(row[j]) - m);
  return m + std::log(z);
}

template <class Real>
void cross_entropy_fwd(Real* losses, const Real* logits, const int32_t* targets, int N, int V) {
  check_dims("cross_entropy_fwd", N, V);
  for (int n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (t < 0) {
      losses[n] = 0;
      continue;
    }
    if (t >= V) fail_index("cross_entropy_fwd", "target", n, t, V);
    const Real* row = logits + size_t(n) * V;
    losses[n] = Real(row_logsumexp(row, V) - Acc(row[t]));
  }
}

template <class Real>
void cross_entropy_bwd(Real* dlogits, const Real* logits, const int32_t* targets, Real dloss, int N,
                       int V) {
  check_dims("cross_entropy_bwd", N, V);
  for (int n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    Real* drow = dlogits + size_t(n) * V;
    if (t < 0) {
      for (int j = 0; j < V; ++j) drow[j] = 0;
      continue;
    }
    if (t >= V) fail_index("cross_entropy_bwd", "target", n, t, V);
    const Real* row = logits + size_t(n) * V;
    const Acc l = row_logsumexp(row, V);
    for (int j = 0; j < V; ++j) {  // in place: row[j] is read before drow[j] is written
      Acc p = std::exp(Acc(row[j]) - l);
      drow[j] = Real((p - (j == t ? 1.0 : 0.0)) * Acc(dloss));
    }
  }
}

template <class Real>
void cross_entropy_part_fwd(Real* stats, const Real* logits, const int32_t* targets, int N, int Vp,
                            int col_begin, int V) {
  check_dims("cross_entropy_part_fwd", N, Vp);
  check_vocab_part("cross_entropy_part_fwd", V, col_begin, Vp);
  for (int n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    if (t >= V) fail_index("cross_entropy_part_fwd", "target", n, t, V);
    const Real* row = logits + size_t(n) * Vp;
    const int64_t j = int64_t(t) - col_begin;
    stats[2 * size_t(n)] = t < 0 ? Real(0) : Real(row_logsumexp(row, Vp));
    stats[2 * size_t(n) + 1] = (t >= 0 && j >= 0 && j < Vp) ? row[j] : Real(0);
  }
}

template <class Real>
void cross_entropy_combine(Real* losses, Real* lse, const Real* stats_all, const int32_t* targets,
                           int N, int P) {
  check_dims("cross_entropy_combine", N, P);
  if (P < 1) fail("cpu::cross_entropy_combine", str("P=", P, " parts; at least one is needed"));
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) {
      losses[n] = lse[n] = 0;
      continue;
    }
    Acc m = -std::numeric_limits<Acc>::infinity(), target = 0;
    for (int p = 0; p < P; ++p) m = std::max(m, Acc(stats_all[(size_t(p) * N + n) * 2]));
    Acc z = 0;
    for (int p = 0; p < P; ++p) {
      z += std::exp(Acc(stats_all[(size_t(p) * N + n) * 2]) - m);
      target += Acc(stats_all[(size_t(p) * N + n) * 2 + 1]);
    }
    const Acc l = m + std::log(z);
    lse[n] = Real(l);
    losses[n] = Real(l - target);
  }
}

template <class Real>
void cross_entropy_part_bwd(Real* dlogits, const Real* logits, const Real* lse,
                            const int32_t* targets, Real dloss, int N, int Vp, int col_begin, int V) {
  check_dims("cross_entropy_part_bwd", N, Vp);
  check_vocab_part("cross_entropy_part_bwd", V, col_begin, Vp);
  for (int n = 0; n < N; ++n) {
    const int32_t t = targets[n];
    Real* drow = dlogits + size_t(n) * Vp;
    if (t < 0) {
      for (int j = 0; j < Vp; ++j) drow[j] = 0;
      continue;
    }
    if (t >= V) fail_index("cross_entropy_part_bwd", "target", n, t, V);
    const Real* row = logits + size_t(n) * Vp;
    const int64_t jt = int64_t(t) - col_begin;
    for (int j = 0; j < Vp; ++j) {  // in place: row[j] is read before drow[j] is written
      Acc p = std::exp(Acc(row[j]) - Acc(lse[n]));
      drow[j] = Real((p - (j == jt ? 1.0 : 0.0)) * Acc(dloss));
    }
  }
}

// ---- elementwise and reductions -------------------------------------------------------------

template <class Real>
void add(Real* out, const Real* a, const Real* b, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class Real>
void scale(Real* x, Real alpha, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] *= alpha;
}

template <class Real>
void sum(double* out, const Real* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]);
  *out = s;
}

template <class Real>
void sum_squares(double* out, const Real* x, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  *out = s;
}

void cast_f32_to_bf16(uint16_t* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16_bits(in[i]);
}

void cast_bf16_to_f32(float* out, const uint16_t* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(in[i]);
}

void round_to_bf16(float* out, const float* in, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(f32_to_bf16_bits(in[i]));
}

// ---- instantiations -------------------------------------------------------------------------

#define STRATA_REF_INSTANTIATE(Real)                                                               \
  template void embedding_fwd<Real>(Real*, const int32_t*, const Real*, int, int, int);                 \
  template void embedding_bwd<Real>(Real*, const Real*, const int32_t*, int, int, int);            \
  template void rmsnorm_fwd<Real>(Real*, Real*, const Real*, const Real*, int, int, Real);         \
  template void rmsnorm_bwd<Real>(Real*, Real*, const Real*, const Real*, const Real*,             \
                                  const Real*, int, int);                                          \
  template void linear_fwd<Real>(Real*, const Real*, const Real*, int, int, int);                  \
  template void linear_bwd<Real>(Real*, Real*, const Real*, const Real*, const Real*, int, int,    \
                                 int);                                                             \
  template void rope_fwd<Real>(Real*, const Real*, const Real*, int, int, int, int, int);          \
  template void rope_bwd<Real>(Real*, const Real*, const Real*, int, int, int, int, int);          \
  template void attention_fwd<Real>(Real*, Real*, const Real*, const Real*, const Real*, int, int, \
                                    int, int, int, int, int);                                      \
  template void attention_bwd<Real>(Real*, Real*, Real*, const Real*, const Real*, const Real*,    \
                                    const Real*, const Real*, const Real*, int, int, int, int,     \
                                    int, int, int);                                                \
  template void swiglu_fwd<Real>(Real*, const Real*, const Real*, int, int, int);                  \
  template void swiglu_bwd<Real>(Real*, Real*, const Real*, const Real*, const Real*, int, int,    \
                                 int);                                                             \
  template void cross_entropy_fwd<Real>(Real*, const Real*, const int32_t*, int, int);             \
  template void cross_entropy_bwd<Real>(Real*, const Real*, const int32_t*, Real, int, int);       \
  template void embedding_part_fwd<Real>(Real*, const int32_t*, const Real*, int, int, int, int,  \
                                         int);                                                     \
  template void embedding_part_bwd<Real>(Real*, const Real*, const int32_t*, int, int, int, int,  \
                                         int);                                                     \
  template void cross_entropy_part_fwd<Real>(Real*, const Real*, const int32_t*, int, int, int,   \
                                             int);                                                 \
  template void cross_entropy_combine<Real>(Real*, Real*, const Real*, const int32_t*, int, int); \
  template void cross_entropy_part_bwd<Real>(Real*, const Real*, const Real*, const int32_t*,     \
                                             Real, int, int, int, int);                            \
  template void add<Real>(Real*, const Real*, const Real*, size_t);                                \
  template void scale<Real>(Real*, Real, size_t);                                                  \
  template void sum<Real>(double*, const Real*, size_t);                                           \
  template void sum_squares<Real>(double*, const Real*, size_t);

STRATA_REF_INSTANTIATE(float)
STRATA_REF_INSTANTIATE(double)
#undef STRATA_REF_INSTANTIATE

}  // namespace strata::cpu::ref
