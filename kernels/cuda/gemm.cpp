// kernels/cuda/gemm.cpp — row-major GEMMs on cuBLASLt (see gemm.h).
//
// cuBLASLt is column-major. A row-major X (r, c) with row stride ld is, read column-major, X^T
// (c, r) with the same ld. So row-major C = op(A)·op(B) is computed as the column-major product
// C^T (n, m) = op(B)^T (n, k) · op(A)^T (k, m): B's column-major view is the first operand
// (transposed iff trans_b), A's the second (transposed iff trans_a).
// Descriptors and heuristic results are cached per device by (type, transposes, shape, leading
// dimensions, pointer alignment); a cached entry lives as long as the device.
#include "kernels/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/cuda_stream.h"

namespace strata::cuda {
namespace {

constexpr int kMaxCandidates = 8;

struct Key {
  int type;
  bool ta, tb;
  int m, n, k;
  int64_t lda, ldb, ldc;
  uint32_t align_a, align_b, align_c;
  auto tie() const { return std::tie(type, ta, tb, m, n, k, lda, ldb, ldc, align_a, align_b, align_c); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct Plan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (out) cublasLtMatrixLayoutDestroy(out);
    if (second) cublasLtMatrixLayoutDestroy(second);
    if (first) cublasLtMatrixLayoutDestroy(first);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

// The largest power of two (at most 256) dividing the address: what cuBLASLt may assume.
uint32_t alignment_of(const void* p) {
  const uintptr_t u = reinterpret_cast<uintptr_t>(p);
  uint32_t a = 256;
  while (a > 1 && u % a != 0) a /= 2;
  return a;
}

template <class T>
void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr, const T& v) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, attr, &v, sizeof(v)));
}
template <class T>
void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t attr, const T& v) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, attr, &v, sizeof(v)));
}

struct Preference {
  cublasLtMatmulPreference_t p = nullptr;
  Preference() { STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&p)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(p); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
};

std::vector<cublasLtMatmulHeuristicResult_t> heuristics(cublasLtHandle_t h, const Plan& plan,
                                                        const Key& key, size_t workspace_bytes,
                                                        bool fma_only) {
  Preference pref;
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(workspace_bytes));
  // The first operand of the column-major call is B, the second A (see the file comment).
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
  set_pref(pref.p, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
  if (fma_only) set_pref(pref.p, CUBLASLT_MATMUL_PREF_IMPL_MASK, uint64_t(CUBLASLT_NUMERICAL_IMPL_FLAGS_FMA));
  cublasLtMatmulHeuristicResult_t results[kMaxCandidates] = {};
  int count = 0;
  const cublasStatus_t rc = cublasLtMatmulAlgoGetHeuristic(h, plan.op, plan.first, plan.second, plan.out,
                                                           plan.out, pref.p, kMaxCandidates, results, &count);
  std::vector<cublasLtMatmulHeuristicResult_t> ok;
  if (rc == CUBLAS_STATUS_NOT_SUPPORTED) return ok;  // no algorithm: the caller decides
  STRATA_CUBLAS_CHECK(rc);
  for (int i = 0; i < count; ++i)
    if (results[i].state == CUBLAS_STATUS_SUCCESS && results[i].workspaceSize <= workspace_bytes)
      ok.push_back(results[i]);
  return ok;
}

std::unique_ptr<Plan> make_plan(cublasLtHandle_t h, const Key& key, size_t workspace_bytes) {
  auto plan = std::make_unique<Plan>();
  const bool f32 = key.type == int(GemmType::f32);
  const bool fast_bf16 = key.type == int(GemmType::f32_bf16);
  const cudaDataType_t io = f32 || fast_bf16 ? CUDA_R_32F : CUDA_R_16BF;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(
      &plan->op, fast_bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_first = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  set_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, op_first);
  set_attr(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, op_second);
  // Stored column-major shapes: B's view is (n, k), or (k, n) when B is transposed; A's view
  // is (k, m), or (m, k) when A is transposed; C's view is (n, m).
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->first, io, key.tb ? key.k : key.n,
                                                 key.tb ? key.n : key.k, key.ldb));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->second, io, key.ta ? key.m : key.k,
                                                 key.ta ? key.k : key.m, key.lda));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->out, io, key.n, key.m, key.ldc));
  plan->algos = heuristics(h, *plan, key, workspace_bytes, f32);
  // COMPUTE_32F on f32 data never uses TF32; the FMA mask only guards against emulated
  // tensor-core algorithms. Should it leave nothing, take what cuBLASLt offers for COMPUTE_32F.
  if (plan->algos.empty() && f32) plan->algos = heuristics(h, *plan, key, workspace_bytes, false);
  // No tensor-core algorithm for these shapes and alignments: the f32 GEMM computes the same
  // product, only more exactly.
  if (plan->algos.empty() && fast_bf16) {
    Key exact = key;
    exact.type = int(GemmType::f32);
    return make_plan(h, exact, workspace_bytes);
  }
  if (plan->algos.empty())
    fail("cuda::gemm",
         str("cuBLASLt offers no algorithm for a ", f32 ? "f32" : "bf16", " GEMM m=", key.m, " n=",
             key.n, " k=", key.k, " (trans_a ", key.ta, ", trans_b ", key.tb, ", lda ", key.lda,
             ", ldb ", key.ldb, ", ldc ", key.ldc, ", alignments ", key.align_a, "/", key.align_b,
             "/", key.align_c, " bytes)"));
  return plan;
}

void check_shape(bool ta, bool tb, int m, int n, int k, int64_t lda, int64_t ldb, int64_t ldc) {
  STRATA_CHECK(m >= 0 && n >= 0 && k >= 0, "cuda::gemm", "negative shape m=", m, " n=", n, " k=", k);
  if (m == 0 || n == 0) return;  // nothing is touched
  STRATA_CHECK(ldc >= n, "cuda::gemm", "ldc=", ldc, " < n=", n);
  if (k == 0) return;  // only C is touched
  STRATA_CHECK(lda >= (ta ? m : k) && ldb >= (tb ? k : n), "cuda::gemm",
               "leading dimensions too small: lda=", lda, " ldb=", ldb, " for m=", m, " n=", n,
               " k=", k, " trans_a ", ta, " trans_b ", tb);
}

}  // namespace

struct GemmCache {
  std::mutex m;
  std::map<Key, std::unique_ptr<Plan>> plans;
};

GemmCache* gemm_cache_create() { return new GemmCache(); }
void gemm_cache_destroy(GemmCache* cache) noexcept { delete cache; }

namespace {

const Plan& plan_for(CudaStream& s, const Key& key) {
  GemmCache* cache = s.context().gemm_cache;
  STRATA_CHECK(cache != nullptr && s.context().lt_handle != nullptr, "cuda::gemm", "no cuBLASLt context");
  std::lock_guard<std::mutex> lock(cache->m);
  auto it = cache->plans.find(key);
  if (it == cache->plans.end())
    it = cache->plans
             .emplace(key, make_plan(static_cast<cublasLtHandle_t>(s.context().lt_handle), key,
                                     kGemmWorkspaceBytes))
             .first;
  return *it->second;  // entries live as long as the device
}

Key key_of(GemmType type, bool ta, bool tb, int m, int n, int k, const void* a, int64_t lda,
           const void* b, int64_t ldb, const void* c, int64_t ldc) {
  return Key{int(type), ta, tb, m, n, k, lda, ldb, ldc, alignment_of(a), alignment_of(b), alignment_of(c)};
}

}  // namespace

void gemm(CudaStream& s, GemmType type, bool ta, bool tb, int m, int n, int k, const void* a,
          int64_t lda, const void* b, int64_t ldb, float beta, void* c, int64_t ldc, int candidate) {
  check_shape(ta, tb, m, n, k, lda, ldb, ldc);
  STRATA_CHECK(beta == 0.0f || beta == 1.0f, "cuda::gemm", "beta must be 0 or 1, got ", beta);
  if (m == 0 || n == 0) return;
  s.make_current();
  cudaStream_t stream = static_cast<cudaStream_t>(s.native());
  const size_t elem = type == GemmType::bf16 ? 2 : 4;
  if (k == 0) {  // an empty sum: C = 0, or C unchanged when accumulating
    if (beta == 0.0f)
      STRATA_CUDA_CHECK(cudaMemset2DAsync(c, size_t(ldc) * elem, 0, size_t(n) * elem, size_t(m), stream));
    return;
  }
  const Plan& plan = plan_for(s, key_of(type, ta, tb, m, n, k, a, lda, b, ldb, c, ldc));
  STRATA_CHECK(candidate >= 0 && size_t(candidate) < plan.algos.size(), "cuda::gemm", "candidate ",
               candidate, " of ", plan.algos.size());
  size_t ws_bytes = 0;
  void* ws = s.gemm_workspace(&ws_bytes);
  const float alpha = 1.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(s.context().lt_handle), plan.op,
                                     &alpha, b, plan.first, a, plan.second, &beta, c, plan.out, c,
                                     plan.out, &plan.algos[size_t(candidate)].algo, ws, ws_bytes,
                                     stream));
}

int gemm_candidates(CudaStream& s, GemmType type, bool ta, bool tb, int m, int n, int k,
                    const void* a, int64_t lda, const void* b, int64_t ldb, const void* c,
                    int64_t ldc) {
  check_shape(ta, tb, m, n, k, lda, ldb, ldc);
  STRATA_CHECK(m > 0 && n > 0 && k > 0, "cuda::gemm_candidates", "empty GEMM m=", m, " n=", n, " k=", k);
  s.make_current();
  return int(plan_for(s, key_of(type, ta, tb, m, n, k, a, lda, b, ldb, c, ldc)).algos.size());
}

}  // namespace strata::cuda
