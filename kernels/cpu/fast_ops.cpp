// kernels/cpu/fast_ops.cpp — fast embedding, elementwise ops, bf16 casts and double-accumulated
// sums. Memory-bound: each is one pass over its data, split across threads in large chunks.
#include "kernels/cpu/fast_ops.h"

#include <bit>
#include <cstring>
#include <vector>

#include "kernels/cpu/fast_common.h"
#include "kernels/cpu/shape_checks.h"

namespace strata::cpu::fast {
namespace {

constexpr int64_t kEmbeddingRowsPerTask = 64;     // rows of C floats copied per task
constexpr int64_t kEmbeddingBwdColsPerTask = 64;  // columns of dwte per task (a 256-byte strip)
constexpr int64_t kElementwiseGrain = 1 << 15;    // elements per task (128 KiB of f32)
constexpr int64_t kReduceChunk = 1 << 16;         // elements per partial sum (fixed: deterministic)

void check_tokens(const char* op, const int32_t* tokens, int N, int64_t V) {
  for (int n = 0; n < N; ++n)
    if (tokens[n] < 0 || tokens[n] >= V) fail_index(op, "token", n, tokens[n], V);
}

}  // namespace

// out (N, C) = the token's row of wte_part (rows [row_begin, row_begin + rows) of the table),
// or zeros for a token another part holds.
void embedding_part_fwd(float* out, const int32_t* tokens, const float* wte_part, int N, int C,
                        int V, int row_begin, int rows) {
  check_dims("embedding_fwd", N, C);
  check_vocab_part("embedding_fwd", V, row_begin, rows);
  check_tokens("embedding_fwd", tokens, N, V);
  parallel_rows(N, kEmbeddingRowsPerTask, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t r = int64_t(tokens[n]) - row_begin;
      if (r >= 0 && r < rows)
        std::memcpy(out + n * C, wte_part + r * C, sizeof(float) * size_t(C));
      else
        std::memset(out + n * C, 0, sizeof(float) * size_t(C));
    }
  });
}

// dwte_part (rows, C) += scatter of the dout (N, C) rows whose token this part holds. Parallel
// over column strips: each task adds every row into its strip in row order, so there are no
// races and the sums are in the reference's order.
void embedding_part_bwd(float* dwte_part, const float* dout, const int32_t* tokens, int N, int C,
                        int V, int row_begin, int rows) {
  check_dims("embedding_bwd", N, C);
  check_vocab_part("embedding_bwd", V, row_begin, rows);
  check_tokens("embedding_bwd", tokens, N, V);
  parallel_rows(C, kEmbeddingBwdColsPerTask, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t r = int64_t(tokens[n]) - row_begin;
      if (r < 0 || r >= rows) continue;
      float* __restrict dst = dwte_part + r * C;
      const float* __restrict src = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
    }
  });
}

void embedding_fwd(float* out, const int32_t* tokens, const float* wte, int N, int C, int V) {
  embedding_part_fwd(out, tokens, wte, N, C, V, 0, V);
}

void embedding_bwd(float* dwte, const float* dout, const int32_t* tokens, int N, int C, int V) {
  embedding_part_bwd(dwte, dout, tokens, N, C, V, 0, V);
}

// out may alias a or b (same index only), which the simd loop allows.
void add(float* out, const float* a, const float* b, size_t n) {
  parallel_rows(int64_t(n), kElementwiseGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) out[i] = a[i] + b[i];
  });
}

void scale(float* x, float alpha, size_t n) {
  parallel_rows(int64_t(n), kElementwiseGrain, [&](int64_t i0, int64_t i1) {
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) x[i] *= alpha;
  });
}

// Round to nearest even, NaN kept a quiet NaN: bit-identical to core/dtype.h f32_to_bf16_bits.
void cast_f32_to_bf16(uint16_t* out, const float* in, size_t n) {
  parallel_rows(int64_t(n), kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    const uint32_t* __restrict u = reinterpret_cast<const uint32_t*>(in);
    uint16_t* __restrict o = out;
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const uint32_t x = u[i];
      const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
      const uint32_t quiet_nan = (x >> 16) | 0x40u;
      o[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
    }
  });
}

void cast_bf16_to_f32(float* out, const uint16_t* in, size_t n) {
  parallel_rows(int64_t(n), kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    uint32_t* __restrict o = reinterpret_cast<uint32_t*>(out);
    const uint16_t* __restrict b = in;
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) o[i] = uint32_t(b[i]) << 16;
  });
}

// cast_f32_to_bf16's rounding, widened in the same pass. (No __restrict: out may alias in.)
void round_to_bf16(float* out, const float* in, size_t n) {
  parallel_rows(int64_t(n), kElementwiseGrain, [&](int64_t i0, int64_t i1) {
    const uint32_t* u = reinterpret_cast<const uint32_t*>(in);
    uint32_t* o = reinterpret_cast<uint32_t*>(out);
#pragma omp simd
    for (int64_t i = i0; i < i1; ++i) {
      const uint32_t x = u[i];
      const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u;
      const uint32_t quiet_nan = (x & 0xffff0000u) | 0x400000u;
      o[i] = (x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
    }
  });
}

namespace {

// Σ f(x[i]) over one chunk with SIMD double accumulators (a plain-pointer function: inside the
// parallel lambda GCC fell back to gathers).
template <bool kSquares>
double chunk_sum(const float* __restrict x, int64_t n) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    const double v = x[i];
    s += kSquares ? v * v : v;
  }
  return s;
}

// Σ f(x[i]) in double: fixed chunks, each summed by chunk_sum, the chunk sums added in chunk
// order.
template <bool kSquares>
double reduce(const float* x, size_t n) {
  if (n == 0) return 0.0;
  const int64_t chunks = (int64_t(n) + kReduceChunk - 1) / kReduceChunk;
  std::vector<double> partial(size_t(chunks), 0.0);
  parallel_chunks(int64_t(n), kReduceChunk, [&](int64_t c, int64_t i0, int64_t i1) {
    partial[size_t(c)] = chunk_sum<kSquares>(x + i0, i1 - i0);
  });
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace

void fill_zero(void* dst, size_t bytes) {
  constexpr int64_t kPiece = int64_t(1) << 20;
  char* d = static_cast<char*>(dst);
  parallel_rows(int64_t(bytes), kPiece, [&](int64_t b0, int64_t b1) { std::memset(d + b0, 0, size_t(b1 - b0)); });
}

void sum(double* out, const float* x, size_t n) { *out = reduce<false>(x, n); }
void sum_squares(double* out, const float* x, size_t n) { *out = reduce<true>(x, n); }

}  // namespace strata::cpu::fast
