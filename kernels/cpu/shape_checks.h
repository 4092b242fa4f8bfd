// kernels/cpu/shape_checks.h — argument checks shared by the reference and fast CPU ops.
//
// Each throws strata::Error naming the op and the offending values; on the CPU device the op
// runs as a stream task, so the error poisons the stream and the next synchronize() rethrows it.
// Cheap (a few comparisons per call); token ranges are checked by the ops themselves.
#pragma once

#include <cstdint>

#include "core/error.h"

namespace strata::cpu {

inline void check_dims(const char* op, int N, int C) {
  if (N < 0 || C < 0) fail(str("cpu::", op), str("negative shape: N=", N, " C=", C));
}

inline void check_strided(const char* op, int N, int F, int ld) {
  check_dims(op, N, F);
  if (ld < F)
    fail(str("cpu::", op), str("row stride ld=", ld, " is smaller than the row width ", F));
}

inline void check_rope(const char* op, const void* cos, const void* sin, int B, int T,
                       int n_heads, int D, int ld) {
  if (B < 0 || T < 0 || n_heads < 0 || D < 0)
    fail(str("cpu::", op), str("negative shape: B=", B, " T=", T, " heads=", n_heads, " D=", D));
  if (D % 2 != 0) fail(str("cpu::", op), str("head dim D=", D, " must be even for rotate_half"));
  if (ld < n_heads * D)
    fail(str("cpu::", op), str("row stride ld=", ld, " < heads*D=", n_heads * D));
  if ((!cos || !sin) && B > 0 && T > 0 && n_heads > 0 && D > 0)
    fail(str("cpu::", op), "the cos/sin tables are null", "build them with rope_tables()");
}

inline void check_attention(const char* op, int B, int T, int H, int KVH, int D, int ldq,
                            int ldkv) {
  if (B < 0 || T < 0 || H <= 0 || KVH <= 0 || D <= 0)
    fail(str("cpu::", op), str("bad shape: B=", B, " T=", T, " H=", H, " KVH=", KVH, " D=", D));
  if (H % KVH != 0)
    fail(str("cpu::", op), str("query heads H=", H, " not a multiple of kv heads KVH=", KVH));
  if (ldq < H * D) fail(str("cpu::", op), str("ldq=", ldq, " < H*D=", H * D));
  if (ldkv < KVH * D) fail(str("cpu::", op), str("ldkv=", ldkv, " < KVH*D=", KVH * D));
}

// A vocabulary part [begin, begin + rows) of V rows (or columns) must lie inside [0, V).
inline void check_vocab_part(const char* op, int V, int begin, int rows) {
  if (V < 0 || begin < 0 || rows < 0 || int64_t(begin) + rows > V)
    fail(str("cpu::", op), str("vocabulary part [", begin, ", ", int64_t(begin) + rows,
                               ") is not inside [0, V=", V, ")"));
}

[[noreturn]] inline void fail_index(const char* op, const char* what, int64_t row, int64_t value,
                                    int64_t limit) {
  fail(str("cpu::", op), str(what, " ", value, " at row ", row, " is outside [0, ", limit, ")"));
}

}  // namespace strata::cpu
