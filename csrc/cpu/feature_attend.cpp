// The sum rule's read of a short sequence from the raw heads, for the maps with a row form (map_rows.h: DPFP-nu, ELU+1,
// Hedgehog, FAVOR+; fw_fairseq/ops/rules/sum/short_read.py; what it shares with the delta rule's, delta_attend.cpp, is
// attend_heads.h).
//
// Per head, P = mask(phi(q) phi(k)^T) [Tq, T] (mask: s <= t where causal), s_t = sum_s P_ts + eps and A = P / s, so
// that A v = W^T phi(q) / (z . phi(q) + eps) (z = sum_s phi(k_s)). Backward from dA [Tq, T]:
// dP_ts = (dA_ts - sum_r dA_tr A_tr) / s_t (0 where masked), then dphi(q) = dP phi(k), dphi(k) = dP^T phi(q), and the
// map's backward a row at a time.
// phi of a head's queries and keys ([Tq + T, E]) lives in a per-task buffer that stays in cache, never in a
// [B, H, T, E] tensor: on a training batch the map's passes over those tensors and their gradients cost as
// much as the products themselves (fw_fairseq/ops/README.md §12). The products call BLAS (sgemm_/dgemm_) where the
// loaded torch exports it (its x86-64 builds carry MKL: the forward 2 times, the backward 1.6 times faster than the
// AVX2 loops on an AVX-512 CPU, DPFP-2), else the register-blocked loops (products.h); `blas` false takes the loops
// anyway (the tests run both).
// Inputs: q [B, H, Tq, d], k [B, H, T, d] in any layout whose d is contiguous, float32 or float64; key_padding_mask
// [B, T] (optional, true at padding): those keys' rows of phi are 0 (they read nothing, and add nothing to s) and
// their dk is 0; causal needs Tq = T.
#include "attend_heads.h"
#include "dot.h"

#include <ATen/Parallel.h>

#include <vector>

namespace {

using fw::Call;
using fw::Heads;
using fw::heads_of;
using fw::Shape;

// heads [b, e): A [Tq, T] into out and s [Tq] into S
template <typename T>
FW_INLINE void forward_range_of(const Heads<const T>& Q, const Heads<const T>& K, const bool* pad, T* out, T* S,
                                const Shape& x, bool causal, int64_t b, int64_t e) {
  fw::with_head<T>(x, [&](auto& head) __attribute__((always_inline)) {
    const int64_t Tq = x.Tq, Tk = x.Tk;
    for (int64_t n = b; n < e; ++n) {
      head.load(Q, K, pad, n);
      T* P = out + n * Tq * Tk;
      head.products(P, Tq, causal);
      for (int64_t t = 0; t < Tq; ++t) {  // A = P / s
        T* __restrict__ row = P + t * Tk;
        const int64_t seen = causal ? t + 1 : Tk;
        const T s = fw::sum(row, seen) + T(x.eps);
        const T inv = T(1) / s;
        for (int64_t j = 0; j < seen; ++j) row[j] *= inv;
        S[n * Tq + t] = s;
      }
    }
  });
}

// heads [b, e): dq [Tq, d] and dk [T, d] of each from dA (G), A and s
template <typename T>
FW_INLINE void backward_range_of(const T* G, const T* A, const T* S, const Heads<const T>& Q, const Heads<const T>& K,
                                 const bool* pad, const Heads<T>& DQ, const Heads<T>& DK, const Shape& x, bool causal,
                                 int64_t b, int64_t e) {
  fw::with_head<T>(x, [&](auto& head) __attribute__((always_inline)) {
    const int64_t Tq = x.Tq, Tk = x.Tk;
    std::vector<T> dP(Tq * Tk);
    for (int64_t n = b; n < e; ++n) {
      head.load(Q, K, pad, n);
      for (int64_t t = 0; t < Tq; ++t) {  // dP through the rows' normalisation, 0 where masked
        const T* __restrict__ gt = G + (n * Tq + t) * Tk;
        T* __restrict__ dp = dP.data() + t * Tk;
        const int64_t seen = causal ? t + 1 : Tk;
        const T inv = T(1) / S[n * Tq + t], c = fw::dot(gt, A + (n * Tq + t) * Tk, seen);
        for (int64_t j = 0; j < seen; ++j) dp[j] = (gt[j] - c) * inv;
        for (int64_t j = seen; j < Tk; ++j) dp[j] = T(0);
      }
      head.back(dP.data(), static_cast<const T*>(nullptr), pad, n, DQ, DK);
    }
  });
}

// One clone set per dtype, overloaded so that AT_DISPATCH's scalar_t picks it (kernels.h).
FW_CLONES void forward_range(const Heads<const float>& Q, const Heads<const float>& K, const bool* pad, float* out,
                             float* S, const Shape& x, bool causal, int64_t b, int64_t e) {
  forward_range_of(Q, K, pad, out, S, x, causal, b, e);
}
FW_CLONES void forward_range(const Heads<const double>& Q, const Heads<const double>& K, const bool* pad, double* out,
                             double* S, const Shape& x, bool causal, int64_t b, int64_t e) {
  forward_range_of(Q, K, pad, out, S, x, causal, b, e);
}
FW_CLONES void backward_range(const float* G, const float* A, const float* S, const Heads<const float>& Q,
                              const Heads<const float>& K, const bool* pad, const Heads<float>& DQ,
                              const Heads<float>& DK, const Shape& x, bool causal, int64_t b, int64_t e) {
  backward_range_of(G, A, S, Q, K, pad, DQ, DK, x, causal, b, e);
}
FW_CLONES void backward_range(const double* G, const double* A, const double* S, const Heads<const double>& Q,
                              const Heads<const double>& K, const bool* pad, const Heads<double>& DQ,
                              const Heads<double>& DK, const Shape& x, bool causal, int64_t b, int64_t e) {
  backward_range_of(G, A, S, Q, K, pad, DQ, DK, x, causal, b, e);
}

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> feature_attend_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                 const c10::optional<torch::Tensor>& key_padding_mask,
                                                                 int64_t map, int64_t nu,
                                                                 const c10::optional<torch::Tensor>& projection,
                                                                 bool causal, double eps, bool blas) {
  const Call c(q, k, key_padding_mask, map, nu, projection, causal, fw::kNone, eps, blas, "feature_attend_forward");
  auto out = torch::empty({c.B, c.H, c.s.Tq, c.s.Tk}, c.q.options());  // A
  auto sums = torch::empty({c.B, c.H, c.s.Tq}, c.q.options());  // s
  AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "feature_attend_forward", [&] {
    const auto Q = heads_of<const scalar_t>(c.q), K = heads_of<const scalar_t>(c.k);
    scalar_t *O = out.data_ptr<scalar_t>(), *S = sums.data_ptr<scalar_t>();
    at::parallel_for(0, c.B * c.H, fw::kHeadGrain, [&](int64_t b, int64_t e) {
      forward_range(Q, K, c.pad_data(), O, S, c.s, causal, b, e);
    });
  });
  return {out, sums};
}

std::tuple<torch::Tensor, torch::Tensor> feature_attend_backward(const torch::Tensor& grad, const torch::Tensor& out,
                                                                  const torch::Tensor& sums, const torch::Tensor& q,
                                                                  const torch::Tensor& k,
                                                                  const c10::optional<torch::Tensor>& key_padding_mask,
                                                                  int64_t map, int64_t nu,
                                                                  const c10::optional<torch::Tensor>& projection,
                                                                  bool causal, double eps, bool blas) {
  const Call c(q, k, key_padding_mask, map, nu, projection, causal, fw::kNone, eps, blas, "feature_attend_backward");
  const std::vector<int64_t> rows{c.B, c.H, c.s.Tq, c.s.Tk}, row_sums{c.B, c.H, c.s.Tq};
  TORCH_CHECK(grad.sizes() == rows && out.sizes() == rows && sums.sizes() == row_sums,
              "feature_attend_backward: grad and out must be feature_attend_forward's A's shape, sums its s");
  const auto dtype = c.q.scalar_type();
  const auto gc = grad.to(dtype).contiguous(), ac = out.to(dtype).contiguous(), sc = sums.to(dtype).contiguous();
  auto dq = torch::empty_like(c.q), dk = torch::empty_like(c.k);  // in q's and k's layouts where they are dense
  AT_DISPATCH_FLOATING_TYPES(dtype, "feature_attend_backward", [&] {
    const auto Q = heads_of<const scalar_t>(c.q), K = heads_of<const scalar_t>(c.k);
    const auto DQ = heads_of<scalar_t>(dq), DK = heads_of<scalar_t>(dk);
    const scalar_t *G = gc.data_ptr<scalar_t>(), *A = ac.data_ptr<scalar_t>(), *S = sc.data_ptr<scalar_t>();
    at::parallel_for(0, c.B * c.H, fw::kHeadGrain, [&](int64_t b, int64_t e) {
      backward_range(G, A, S, Q, K, c.pad_data(), DQ, DK, c.s, causal, b, e);
    });
  });
  return {dq, dk};
}

bool feature_attend_blas() { return fw::blas_found(); }
