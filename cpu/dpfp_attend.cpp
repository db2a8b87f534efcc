// The sum rule's read in the short order with DPFP-nu features, from the raw heads (fw_fairseq/ops/dpfp_attend.py).
//
// Per head: P = mask(phi(q) phi(k)^T) [Tq, T] (mask: s <= t where causal), s_t = sum_s P_ts + eps and A = P / s,
// so that A v = W^T phi(q) / (z . phi(q) + eps), the sum rule's normalised read (z = sum_s phi(k_s)).
// Backward from dA [Tq, T]: dP_ts = (dA_ts - sum_r dA_tr A_tr) / s_t (0 where masked), dphi(q) = dP phi(k),
// dphi(k) = dP^T phi(q), then DPFP's backward a row at a time (dpfp_rows.h).
// phi of a head's queries and keys ([Tq + T, 2 d nu]) lives in a per-task buffer that stays in cache, never in a
// [B, H, T, 2 d nu] tensor: on a training batch the map's passes over those tensors and their gradients cost as
// much as the products themselves (fw_fairseq/ops/README.md §12). The products call BLAS (sgemm_/dgemm_) where the
// loaded torch exports it (its x86-64 builds carry MKL, 2-3 times faster here than the AVX2 loops below on a CPU
// with AVX-512), else the register-blocked loops; `blas` false takes the loops anyway (the tests run both).
// Inputs: q [B, H, Tq, d], k [B, H, T, d] (made contiguous), float32 or float64; causal needs Tq = T.
#include "kernels.h"
#include "dot.h"
#include "dpfp_rows.h"

#include <ATen/Parallel.h>

#include <cstring>
#include <vector>

// BLAS's Fortran entry points, weak: null where no loaded library defines them (ATen's cpublas does not export its
// own gemm to extensions)
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*) __attribute__((weak));
}

namespace {

using fw::kNone;

bool blas_found() { return sgemm_ != nullptr && dgemm_ != nullptr; }

// column-major BLAS C [m, n] = op(A) op(B); a row-major X [r, c] is the column-major X^T (ld c)
inline void gemm(char ta, char tb, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C,
                 int ldc) {
  const float one = 1, zero = 0;
  sgemm_(&ta, &tb, &m, &n, &k, &one, A, &lda, B, &ldb, &zero, C, &ldc);
}
inline void gemm(char ta, char tb, int m, int n, int k, const double* A, int lda, const double* B, int ldb, double* C,
                 int ldc) {
  const double one = 1, zero = 0;
  dgemm_(&ta, &tb, &m, &n, &k, &one, A, &lda, B, &ldb, &zero, C, &ldc);
}

// out [kRows, E] (row stride E) = sum_{i in [i0, i1)} C[r cr + i ci] X[i] for the kRows rows r, X [n, E]: the
// products dP phi(k) (cr = T, ci = 1) and dP^T phi(q) (cr = 1, ci = T). E is taken in tiles of kTile vectors whose
// kRows x kTile partial sums stay in registers while the X rows stream through (8 of AVX2's 16 at kRows = 4).
constexpr int kTile = 2;

template <typename T, int kRows>
inline __attribute__((always_inline)) void weighted_rows(const T* C, int64_t cr, int64_t ci, int64_t i0, int64_t i1,
                                                         const T* X, int64_t E, T* out) {
  using Vec = typename fw::Lanes<T>::Vec;
  constexpr int64_t L = fw::Lanes<T>::kWidth, W = L * kTile;
  int64_t j = 0;
  for (; j + W <= E; j += W) {
    Vec acc[kRows][kTile] = {};
    for (int64_t i = i0; i < i1; ++i) {
      Vec x[kTile];
      for (int v = 0; v < kTile; ++v) x[v] = fw::load(X + i * E + j + v * L);
      for (int r = 0; r < kRows; ++r) {
        const T c = C[r * cr + i * ci];
        for (int v = 0; v < kTile; ++v) acc[r][v] += c * x[v];
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int v = 0; v < kTile; ++v) std::memcpy(out + r * E + j + v * L, &acc[r][v], sizeof(Vec));
  }
  for (; j < E; ++j)  // the columns past the last whole tile
    for (int r = 0; r < kRows; ++r) {
      T total = T(0);
      for (int64_t i = i0; i < i1; ++i) total += C[r * cr + i * ci] * X[i * E + j];
      out[r * E + j] = total;
    }
}

// weighted_rows for n rows, kRows at a time; row r sums over [lo(r0), hi(r0 + block)) (causal ranges)
template <typename T, typename Lo, typename Hi>
inline __attribute__((always_inline)) void weighted(const T* C, int64_t cr, int64_t ci, int64_t n, Lo lo, Hi hi,
                                                    const T* X, int64_t E, T* out) {
  constexpr int kRows = 4;
  int64_t r = 0;
  for (; r + kRows <= n; r += kRows)
    weighted_rows<T, kRows>(C + r * cr, cr, ci, lo(r), hi(r + kRows), X, E, out + r * E);
  for (; r < n; ++r) weighted_rows<T, 1>(C + r * cr, cr, ci, lo(r), hi(r + 1), X, E, out + r * E);
}

// P [Tq, T] = phi_q phi_k^T: BLAS (P^T = phi_k phi_q^T column-major), or two rows at a time (dpfp_rows.h's
// feature_scores), causal only up to the block's end
template <typename T>
inline __attribute__((always_inline)) void scores(const T* phi_q, const T* phi_k, T* P, int64_t Tq, int64_t Tk,
                                                  int64_t E, bool causal, bool blas) {
  if (blas) return gemm('T', 'N', Tk, Tq, E, phi_k, E, phi_q, E, P, Tk);
  int64_t t = 0;
  for (; t + 2 <= Tq; t += 2) {
    const T* rows[2] = {phi_q + t * E, phi_q + (t + 1) * E};
    fw::feature_scores<T, 2>(rows, phi_k, P + t * Tk, causal ? t + 2 : Tk, E, E, Tk);
  }
  if (t < Tq) {
    const T* rows[1] = {phi_q + t * E};
    fw::feature_scores<T, 1>(rows, phi_k, P + t * Tk, causal ? t + 1 : Tk, E, E, Tk);
  }
}

// dphi(q) = dP phi(k) [Tq, E] into dphi, dphi(k) = dP^T phi(q) [T, E] after it, by the loops; causal, dP is 0 past
// the diagonal: row t sums s <= t, and key s sums t >= s
template <typename T>
inline __attribute__((always_inline)) void backward_products(const T* dP, const T* phi, T* dphi, int64_t Tq,
                                                             int64_t Tk, int64_t E, bool causal) {
  const auto all_t = [&](int64_t) { return Tq; };
  weighted(dP, Tk, 1, Tq, [](int64_t) { return int64_t(0); },
           [&](int64_t end) { return causal ? std::min(end, Tk) : Tk; }, phi + Tq * E, E, dphi);
  weighted(dP, 1, Tk, Tk, [&](int64_t start) { return causal ? start : int64_t(0); }, all_t, phi, E, dphi + Tq * E);
}

// phi of the head's Tq query rows X_q and T key rows X_k into phi [Tq + T, E]
template <typename T>
inline __attribute__((always_inline)) void head_features(const T* Xq, const T* Xk, T* phi, int64_t Tq, int64_t Tk,
                                                         int64_t d, int64_t nu) {
  fw::forward_rows(Xq, phi, d, nu, kNone, 0.0, 0, Tq);
  fw::forward_rows(Xk, phi + Tq * 2 * d * nu, d, nu, kNone, 0.0, 0, Tk);
}

// heads [b, e): A [Tq, T] and s [Tq] of each
template <typename T>
inline __attribute__((always_inline)) void forward_heads(const T* Q, const T* K, T* A, T* S, int64_t Tq, int64_t Tk,
                                                         int64_t d, int64_t nu, bool causal, double eps, bool blas,
                                                         int64_t b, int64_t e) {
  const int64_t E = 2 * d * nu;
  std::vector<T> phi((Tq + Tk) * E);  // [Tq + T, E]: the queries' features, then the keys'
  for (int64_t n = b; n < e; ++n) {
    head_features(Q + n * Tq * d, K + n * Tk * d, phi.data(), Tq, Tk, d, nu);
    T* P = A + n * Tq * Tk;
    scores(phi.data(), phi.data() + Tq * E, P, Tq, Tk, E, causal, blas);
    for (int64_t t = 0; t < Tq; ++t) {
      T* __restrict__ row = P + t * Tk;
      const int64_t seen = causal ? t + 1 : Tk;
      for (int64_t j = seen; j < Tk; ++j) row[j] = T(0);
      const T s = fw::sum(row, seen) + T(eps);
      const T inv = T(1) / s;
      for (int64_t j = 0; j < seen; ++j) row[j] *= inv;
      S[n * Tq + t] = s;
    }
  }
}

// heads [b, e): dq [Tq, d] and dk [T, d] of each from dA, A and s
template <typename T>
inline __attribute__((always_inline)) void backward_heads(const T* dA, const T* A, const T* S, const T* Q, const T* K,
                                                          T* DQ, T* DK, int64_t Tq, int64_t Tk, int64_t d, int64_t nu,
                                                          bool causal, bool blas, int64_t b, int64_t e) {
  const int64_t E = 2 * d * nu;
  std::vector<T> phi((Tq + Tk) * E), dphi((Tq + Tk) * E), dP(Tq * Tk);
  for (int64_t n = b; n < e; ++n) {
    const T *Xq = Q + n * Tq * d, *Xk = K + n * Tk * d;
    head_features(Xq, Xk, phi.data(), Tq, Tk, d, nu);
    for (int64_t t = 0; t < Tq; ++t) {
      const T* __restrict__ g = dA + (n * Tq + t) * Tk;
      const T* __restrict__ a = A + (n * Tq + t) * Tk;
      T* __restrict__ dp = dP.data() + t * Tk;
      const int64_t seen = causal ? t + 1 : Tk;
      const T inv = T(1) / S[n * Tq + t], c = fw::dot(g, a, seen);
      for (int64_t j = 0; j < seen; ++j) dp[j] = (g[j] - c) * inv;
      for (int64_t j = seen; j < Tk; ++j) dp[j] = T(0);
    }
    // dphi(q) = dP phi(k), dphi(k) = dP^T phi(q); column-major: dphi(q)^T = phi(k)^T dP^T, dphi(k)^T = phi(q)^T dP
    T* dphi_k = dphi.data() + Tq * E;
    if (blas) {
      gemm('N', 'N', E, Tq, Tk, phi.data() + Tq * E, E, dP.data(), Tk, dphi.data(), E);
      gemm('N', 'T', E, Tk, Tq, phi.data(), E, dP.data(), Tk, dphi_k, E);
    } else {
      backward_products(dP.data(), phi.data(), dphi.data(), Tq, Tk, E, causal);
    }
    fw::backward_rows(dphi.data(), Xq, DQ + n * Tq * d, d, nu, kNone, 0.0, 0, Tq);
    fw::backward_rows(dphi_k, Xk, DK + n * Tk * d, d, nu, kNone, 0.0, 0, Tk);
  }
}
// One clone set per dtype, overloaded so that AT_DISPATCH's scalar_t picks it (kernels.h).
FW_CLONES void forward_range(const float* Q, const float* K, float* A, float* S, int64_t Tq, int64_t Tk, int64_t d,
                             int64_t nu, bool causal, double eps, bool blas, int64_t b, int64_t e) {
  forward_heads(Q, K, A, S, Tq, Tk, d, nu, causal, eps, blas, b, e);
}
FW_CLONES void forward_range(const double* Q, const double* K, double* A, double* S, int64_t Tq, int64_t Tk, int64_t d,
                             int64_t nu, bool causal, double eps, bool blas, int64_t b, int64_t e) {
  forward_heads(Q, K, A, S, Tq, Tk, d, nu, causal, eps, blas, b, e);
}
FW_CLONES void backward_range(const float* dA, const float* A, const float* S, const float* Q, const float* K,
                              float* DQ, float* DK, int64_t Tq, int64_t Tk, int64_t d, int64_t nu, bool causal,
                              bool blas, int64_t b, int64_t e) {
  backward_heads(dA, A, S, Q, K, DQ, DK, Tq, Tk, d, nu, causal, blas, b, e);
}
FW_CLONES void backward_range(const double* dA, const double* A, const double* S, const double* Q, const double* K,
                              double* DQ, double* DK, int64_t Tq, int64_t Tk, int64_t d, int64_t nu, bool causal,
                              bool blas, int64_t b, int64_t e) {
  backward_heads(dA, A, S, Q, K, DQ, DK, Tq, Tk, d, nu, causal, blas, b, e);
}

void check(const torch::Tensor& q, const torch::Tensor& k, int64_t nu, bool causal, const char* fn) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu(), fn, ": q and k must be CPU tensors");
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), fn, ": q and k must share a dtype");
  TORCH_CHECK(q.scalar_type() == torch::kFloat || q.scalar_type() == torch::kDouble, fn,
              ": q and k must be float32 or float64");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                  q.size(3) == k.size(3) && q.size(3) >= 1,
              fn, ": q and k must be [B, H, Tq, d] and [B, H, T, d]");
  TORCH_CHECK(nu >= 1 && nu <= 2 * q.size(3) - 1, fn, ": nu must be in 1..2d-1");
  TORCH_CHECK(!causal || q.size(2) == k.size(2), fn, ": causal needs as many queries as keys");
  TORCH_CHECK(q.size(2) >= 1 && k.size(2) >= 1, fn, ": q and k need at least one position");
  // BLAS takes int sizes: a head's [T, 2 d nu] features must fit
  TORCH_CHECK(std::max(q.size(2), k.size(2)) * 2 * q.size(3) * nu < (int64_t(1) << 31), fn, ": too long for BLAS");
}

// heads a task takes: a head's products are tens of microseconds on a training batch
constexpr int64_t kHeadGrain = 2;

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> dpfp_attend_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                              int64_t nu, bool causal, double eps, bool blas) {
  check(q, k, nu, causal, "dpfp_attend_forward");
  blas = blas && blas_found();
  const auto qc = q.contiguous(), kc = k.contiguous();
  const int64_t B = qc.size(0), H = qc.size(1), Tq = qc.size(2), Tk = kc.size(2), d = qc.size(3);
  auto weights = torch::empty({B, H, Tq, Tk}, qc.options());  // A
  auto sums = torch::empty({B, H, Tq}, qc.options());  // s
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "dpfp_attend_forward", [&] {
    const scalar_t *Q = qc.data_ptr<scalar_t>(), *K = kc.data_ptr<scalar_t>();
    scalar_t *A = weights.data_ptr<scalar_t>(), *S = sums.data_ptr<scalar_t>();
    at::parallel_for(0, B * H, kHeadGrain,
                     [&](int64_t b, int64_t e) { forward_range(Q, K, A, S, Tq, Tk, d, nu, causal, eps, blas, b, e); });
  });
  return {weights, sums};
}

std::tuple<torch::Tensor, torch::Tensor> dpfp_attend_backward(const torch::Tensor& grad, const torch::Tensor& weights,
                                                               const torch::Tensor& sums, const torch::Tensor& q,
                                                               const torch::Tensor& k, int64_t nu, bool causal,
                                                               bool blas) {
  check(q, k, nu, causal, "dpfp_attend_backward");
  blas = blas && blas_found();
  const auto qc = q.contiguous(), kc = k.contiguous();
  const int64_t B = qc.size(0), H = qc.size(1), Tq = qc.size(2), Tk = kc.size(2), d = qc.size(3);
  TORCH_CHECK(grad.sizes() == weights.sizes() && weights.sizes() == torch::IntArrayRef({B, H, Tq, Tk}) &&
                  sums.sizes() == torch::IntArrayRef({B, H, Tq}),
              "dpfp_attend_backward: grad and weights must be [B, H, Tq, T], sums [B, H, Tq]");
  const auto gc = grad.to(qc.scalar_type()).contiguous(), ac = weights.contiguous(), sc = sums.contiguous();
  auto dq = torch::empty_like(qc), dk = torch::empty_like(kc);
  AT_DISPATCH_FLOATING_TYPES(qc.scalar_type(), "dpfp_attend_backward", [&] {
    const scalar_t *G = gc.data_ptr<scalar_t>(), *A = ac.data_ptr<scalar_t>(), *S = sc.data_ptr<scalar_t>();
    const scalar_t *Q = qc.data_ptr<scalar_t>(), *K = kc.data_ptr<scalar_t>();
    scalar_t *DQ = dq.data_ptr<scalar_t>(), *DK = dk.data_ptr<scalar_t>();
    at::parallel_for(0, B * H, kHeadGrain, [&](int64_t b, int64_t e) {
      backward_range(G, A, S, Q, K, DQ, DK, Tq, Tk, d, nu, causal, blas, b, e);
    });
  });
  return {dq, dk};
}

bool dpfp_attend_blas() { return blas_found(); }
