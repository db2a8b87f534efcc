// The delta rule's read of a short sequence from the raw heads, for the maps with a row form (map_rows.h;
// fw_fairseq/ops/rules/delta/short_read.py; attend_heads.h is what it shares with the sum rule's read): causal, one chunk of
// chunked_delta with no state (README §2), or not (fast_weight_attend's short order: every query reads the memory
// after the last write).
//
// Per head, with phi normalised by `norm` (--fw-delta-norm): P = phi(q) phi(k)^T [Tq, T] (tril where causal),
// X = tril(phi(k) phi(k)^T, -1) and the writes U [T, M] of (I + diag(beta) X) U = diag(beta) V, by forward
// substitution:
//     u_t = beta_t (v_t - sum_{s<t} X_ts u_s),    O = P U.
// Backward from dO, with A = I + diag(beta) X and G = A^-T dU (back substitution, g_t = du_t - sum_{s>t} beta_s X_st g_s):
//     dU = P^T dO,   dP = dO U^T (tril where causal),   dV = diag(beta) G,   dA = -G U^T (below the diagonal),
//     dX_ts = beta_t dA_ts,   dbeta_t = v_t . g_t + sum_{s<t} dA_ts X_ts,
// then dq and dk from dP and dX (attend_heads.h). The [T, T] algebra stays in the head's buffers: as torch ops (a
// batched triangular solve and its backward, copies to LAPACK's layout, products, masks) it took 2.7-2.9 ms forward
// and backward at B H = 128 heads of T = 32, M = 64 on one thread, a third of this kernel's whole read (7.7 ms with
// DPFP-2's phi and products; both on a machine running other jobs).
// Inputs: q [B, H, Tq, d], k [B, H, T, d] and v [B, H, T, M] in any layout whose last dim is contiguous, beta
// [B, H, T]; float32 or float64; causal needs Tq = T. A padded position has beta = 0 and v = 0 (the module's pad
// values): it writes nothing, and its key is read through a zero write.
#include "attend_heads.h"
#include "dot.h"

#include <ATen/Parallel.h>

#include <vector>

namespace {

using fw::Call;
using fw::Heads;
using fw::heads_of;
using fw::Shape;

// y[m] += a x[m], m < M
template <typename T>
FW_INLINE void axpy(T* __restrict__ y, T a, const T* __restrict__ x, int64_t M) {
  for (int64_t m = 0; m < M; ++m) y[m] += a * x[m];
}

// What a range of heads reads besides q and k: v's heads, beta [B H, T] and the values' width M
template <typename T>
struct DeltaArgs {
  Heads<const T> V;
  const T* beta;
  int64_t M;
};

// heads [b, e): O [Tq, M] into out and U [T, M] into U
template <typename T>
FW_INLINE void forward_range_of(const Heads<const T>& Q, const Heads<const T>& K, const DeltaArgs<T>& a, T* out, T* U,
                                const Shape& x, bool causal, int64_t b, int64_t e) {
  fw::with_head<T>(x, [&](auto& head) __attribute__((always_inline)) {
    const int64_t Tq = x.Tq, Tk = x.Tk, M = a.M;
    std::vector<T> PX((Tq + Tk) * Tk);  // [P; X]
    for (int64_t n = b; n < e; ++n) {
      head.load(Q, K, nullptr, n);
      head.products(PX.data(), Tq + Tk, causal);
      const T* X = PX.data() + Tq * Tk;
      const T* beta = a.beta + n * Tk;
      T* u = U + n * Tk * M;
      fw::gather(a.V, n, Tk, M, u);
      for (int64_t t = 0; t < Tk; ++t) {  // u_t = beta_t (v_t - sum_{s<t} X_ts u_s)
        T* __restrict__ ut = u + t * M;
        for (int64_t s = 0; s < t; ++s) axpy(ut, -X[t * Tk + s], u + s * M, M);
        for (int64_t m = 0; m < M; ++m) ut[m] *= beta[t];
      }
      fw::mm_ab(Tq, M, Tk, PX.data(), u, out + n * Tq * M, x.blas);  // O = P U
    }
  });
}

// heads [b, e): dq, dk (in their layouts), dv [T, M] into DV and dbeta [T] into DB, from dO (G) and U
template <typename T>
FW_INLINE void backward_range_of(const T* G, const T* U, const Heads<const T>& Q, const Heads<const T>& K,
                                 const DeltaArgs<T>& a, const Heads<T>& DQ, const Heads<T>& DK, T* DV, T* DB,
                                 const Shape& x, bool causal, int64_t b, int64_t e) {
  fw::with_head<T>(x, [&](auto& head) __attribute__((always_inline)) {
    const int64_t Tq = x.Tq, Tk = x.Tk, M = a.M;
    std::vector<T> PX((Tq + Tk) * Tk), Pt(Tk * Tq), dP(Tq * Tk), dX(Tk * Tk), g(Tk * M), v(Tk * M);
    for (int64_t n = b; n < e; ++n) {
      head.load(Q, K, nullptr, n);
      head.products(PX.data(), Tq + Tk, causal);
      const T *P = PX.data(), *X = PX.data() + Tq * Tk, *beta = a.beta + n * Tk;
      const T *dO = G + n * Tq * M, *u = U + n * Tk * M;
      for (int64_t t = 0; t < Tq; ++t)
        for (int64_t s = 0; s < Tk; ++s) Pt[s * Tq + t] = P[t * Tk + s];
      fw::mm_ab(Tk, M, Tq, Pt.data(), dO, g.data(), x.blas);  // dU = P^T dO, back-substituted in place into G:
      for (int64_t t = Tk - 1; t >= 0; --t) {  // g_t = du_t - sum_{s>t} beta_s X_st g_s
        T* __restrict__ gt = g.data() + t * M;
        for (int64_t s = t + 1; s < Tk; ++s) axpy(gt, -beta[s] * X[s * Tk + t], g.data() + s * M, M);
      }
      fw::mm_abt(Tq, Tk, M, dO, u, dP.data(), x.blas);  // dP = dO U^T (tril where causal)
      if (causal)
        for (int64_t t = 0; t < Tq; ++t) std::fill(dP.data() + t * Tk + t + 1, dP.data() + (t + 1) * Tk, T(0));
      fw::mm_abt(Tk, Tk, M, g.data(), u, dX.data(), x.blas);  // G U^T = -dA, into dX's buffer
      fw::gather(a.V, n, Tk, M, v.data());
      for (int64_t t = 0; t < Tk; ++t) {
        T* __restrict__ dx = dX.data() + t * Tk;
        T total = fw::dot(v.data() + t * M, g.data() + t * M, M);  // dbeta_t = v_t . g_t + sum_{s<t} dA_ts X_ts
        for (int64_t s = 0; s < t; ++s) {
          total -= dx[s] * X[t * Tk + s];
          dx[s] *= -beta[t];  // dX_ts = beta_t dA_ts
        }
        std::fill(dx + t, dx + Tk, T(0));
        DB[n * Tk + t] = total;
        for (int64_t m = 0; m < M; ++m) DV[(n * Tk + t) * M + m] = beta[t] * g[t * M + m];
      }
      head.back(dP.data(), dX.data(), nullptr, n, DQ, DK);
    }
  });
}

// One clone set per dtype, overloaded so that AT_DISPATCH's scalar_t picks it (kernels.h).
FW_CLONES void forward_range(const Heads<const float>& Q, const Heads<const float>& K, const DeltaArgs<float>& a,
                             float* out, float* U, const Shape& x, bool causal, int64_t b, int64_t e) {
  forward_range_of(Q, K, a, out, U, x, causal, b, e);
}
FW_CLONES void forward_range(const Heads<const double>& Q, const Heads<const double>& K, const DeltaArgs<double>& a,
                             double* out, double* U, const Shape& x, bool causal, int64_t b, int64_t e) {
  forward_range_of(Q, K, a, out, U, x, causal, b, e);
}
FW_CLONES void backward_range(const float* G, const float* U, const Heads<const float>& Q, const Heads<const float>& K,
                              const DeltaArgs<float>& a, const Heads<float>& DQ, const Heads<float>& DK, float* DV,
                              float* DB, const Shape& x, bool causal, int64_t b, int64_t e) {
  backward_range_of(G, U, Q, K, a, DQ, DK, DV, DB, x, causal, b, e);
}
FW_CLONES void backward_range(const double* G, const double* U, const Heads<const double>& Q,
                              const Heads<const double>& K, const DeltaArgs<double>& a, const Heads<double>& DQ,
                              const Heads<double>& DK, double* DV, double* DB, const Shape& x, bool causal,
                              int64_t b, int64_t e) {
  backward_range_of(G, U, Q, K, a, DQ, DK, DV, DB, x, causal, b, e);
}

// the checked call, and v (M contiguous) and beta (contiguous) in q's dtype
struct DeltaCall : Call {
  torch::Tensor v, beta;
  DeltaCall(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v_, const torch::Tensor& beta_,
            int64_t map, int64_t nu, const c10::optional<torch::Tensor>& R, bool causal, int64_t norm, double eps,
            bool blas, const char* fn)
      : Call(q, k, c10::nullopt, map, nu, R, causal, norm, eps, blas, fn) {
    TORCH_CHECK(v_.dim() == 4 && v_.size(0) == B && v_.size(1) == H && v_.size(2) == s.Tk && v_.size(3) >= 1, fn,
                ": v must be [B, H, T, M]");
    TORCH_CHECK(beta_.sizes() == torch::IntArrayRef({B, H, s.Tk}), fn, ": beta must be [B, H, T]");
    TORCH_CHECK(v_.scalar_type() == q.scalar_type() && beta_.scalar_type() == q.scalar_type(), fn,
                ": v and beta must have q's dtype");
    v = last_contiguous(v_);
    beta = beta_.contiguous();
  }

  template <typename T>
  DeltaArgs<T> args() const {
    return DeltaArgs<T>{heads_of<const T>(v), beta.data_ptr<T>(), v.size(3)};
  }
};

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> delta_attend_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                               const torch::Tensor& v, const torch::Tensor& beta,
                                                               int64_t map, int64_t nu,
                                                               const c10::optional<torch::Tensor>& projection,
                                                               bool causal, int64_t norm, double eps, bool blas) {
  const DeltaCall c(q, k, v, beta, map, nu, projection, causal, norm, eps, blas, "delta_attend_forward");
  auto out = torch::empty({c.B, c.H, c.s.Tq, c.v.size(3)}, c.q.options());  // O
  auto writes = torch::empty({c.B, c.H, c.s.Tk, c.v.size(3)}, c.q.options());  // U
  AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "delta_attend_forward", [&] {
    const auto Q = heads_of<const scalar_t>(c.q), K = heads_of<const scalar_t>(c.k);
    const auto a = c.args<scalar_t>();
    scalar_t *O = out.data_ptr<scalar_t>(), *U = writes.data_ptr<scalar_t>();
    at::parallel_for(0, c.B * c.H, fw::kHeadGrain, [&](int64_t b, int64_t e) {
      forward_range(Q, K, a, O, U, c.s, causal, b, e);
    });
  });
  return {out, writes};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> delta_attend_backward(
    const torch::Tensor& grad, const torch::Tensor& writes, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const torch::Tensor& beta, int64_t map, int64_t nu,
    const c10::optional<torch::Tensor>& projection, bool causal, int64_t norm, double eps, bool blas) {
  const DeltaCall c(q, k, v, beta, map, nu, projection, causal, norm, eps, blas, "delta_attend_backward");
  const std::vector<int64_t> read{c.B, c.H, c.s.Tq, c.v.size(3)}, rows{c.B, c.H, c.s.Tk, c.v.size(3)};
  TORCH_CHECK(grad.sizes() == read && writes.sizes() == rows,
              "delta_attend_backward: grad and writes must be delta_attend_forward's O's and U's shape");
  const auto dtype = c.q.scalar_type();
  const auto gc = grad.to(dtype).contiguous(), uc = writes.to(dtype).contiguous();
  auto dq = torch::empty_like(c.q), dk = torch::empty_like(c.k);  // in q's and k's layouts where they are dense
  auto dv = torch::empty(rows, c.q.options()), dbeta = torch::empty({c.B, c.H, c.s.Tk}, c.q.options());
  AT_DISPATCH_FLOATING_TYPES(dtype, "delta_attend_backward", [&] {
    const auto Q = heads_of<const scalar_t>(c.q), K = heads_of<const scalar_t>(c.k);
    const auto DQ = heads_of<scalar_t>(dq), DK = heads_of<scalar_t>(dk);
    const auto a = c.args<scalar_t>();
    const scalar_t *G = gc.data_ptr<scalar_t>(), *U = uc.data_ptr<scalar_t>();
    scalar_t *DV = dv.data_ptr<scalar_t>(), *DB = dbeta.data_ptr<scalar_t>();
    at::parallel_for(0, c.B * c.H, fw::kHeadGrain, [&](int64_t b, int64_t e) {
      backward_range(G, U, Q, K, a, DQ, DK, DV, DB, c.s, causal, b, e);
    });
  });
  return {dq, dk, dv, dbeta};
}
