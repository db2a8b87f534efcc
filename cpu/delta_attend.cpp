// The delta rule's read of a short causal sequence (one chunk of chunked_delta with no state, README §2) from the raw
// heads, for the maps with a row form (map_rows.h; fw_fairseq/ops/feature_attend.py; attend_heads.h is what it shares
// with the sum rule's read).
//
// Per head, with phi normalised by `norm` (--fw-delta-norm): P = tril(phi(q) phi(k)^T), X = tril(phi(k) phi(k)^T, -1)
// and the writes U [T, M] of (I + diag(beta) X) U = diag(beta) V, by forward substitution:
//     u_t = beta_t (v_t - sum_{s<t} X_ts u_s),    O = P U.
// Backward from dO, with A = I + diag(beta) X and G = A^-T dU (back substitution, g_t = du_t - sum_{s>t} beta_s X_st g_s):
//     dU = P^T dO,   dP = tril(dO U^T),   dV = diag(beta) G,   dA = -G U^T (below the diagonal),
//     dX_ts = beta_t dA_ts,   dbeta_t = v_t . g_t + sum_{s<t} dA_ts X_ts,
// then dq and dk from dP and dX (attend_heads.h). The [T, T] algebra stays in the head's buffers: as torch ops (a
// batched triangular solve and its backward, copies to LAPACK's layout, products, masks) it took 2.7-2.9 ms forward
// and backward at B H = 128 heads of T = 32, M = 64 on one thread, a third of this kernel's whole read (7.7 ms with
// DPFP-2's phi and products; both on a machine running other jobs).
// Inputs: q, k [B, H, T, d] and v [B, H, T, M] in any layout whose last dim is contiguous, beta [B, H, T]; float32 or
// float64. A padded position has beta = 0 and v = 0 (the module's pad values): it writes nothing.
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

// What a range of heads reads and writes besides q and k: v's heads, beta [B H, T], and the [B H, T, M] tensors
template <typename T>
struct DeltaArgs {
  Heads<const T> V;
  const T* beta;
  int64_t M;
};

// heads [b, e): O [T, M] into out and U [T, M] into U
template <typename T>
FW_INLINE void forward_range_of(const Heads<const T>& Q, const Heads<const T>& K, const DeltaArgs<T>& a, T* out, T* U,
                                const Shape& x, bool blas, int64_t b, int64_t e) {
  fw::with_head<T>(x, [&](auto& head) __attribute__((always_inline)) {
    const int64_t Tn = x.Tk, M = a.M;
    std::vector<T> PX(2 * Tn * Tn);
    for (int64_t n = b; n < e; ++n) {
      head.load(Q, K, nullptr, n);
      head.products(PX.data(), 2 * Tn, true, blas);
      const T* X = PX.data() + Tn * Tn;
      const T* beta = a.beta + n * Tn;
      T* u = U + n * Tn * M;
      fw::gather(a.V, n, Tn, M, u);
      for (int64_t t = 0; t < Tn; ++t) {  // u_t = beta_t (v_t - sum_{s<t} X_ts u_s)
        T* __restrict__ ut = u + t * M;
        for (int64_t s = 0; s < t; ++s) axpy(ut, -X[t * Tn + s], u + s * M, M);
        for (int64_t m = 0; m < M; ++m) ut[m] *= beta[t];
      }
      fw::mm_ab(Tn, M, Tn, PX.data(), u, out + n * Tn * M, blas);  // O = P U
    }
  });
}

// heads [b, e): dq, dk (in their layouts), dv [T, M] into DV and dbeta [T] into DB, from dO (G) and U
template <typename T>
FW_INLINE void backward_range_of(const T* G, const T* U, const Heads<const T>& Q, const Heads<const T>& K,
                                 const DeltaArgs<T>& a, const Heads<T>& DQ, const Heads<T>& DK, T* DV, T* DB,
                                 const Shape& x, bool blas, int64_t b, int64_t e) {
  fw::with_head<T>(x, [&](auto& head) __attribute__((always_inline)) {
    const int64_t Tn = x.Tk, M = a.M;
    std::vector<T> PX(2 * Tn * Tn), Pt(Tn * Tn), dP(Tn * Tn), dX(Tn * Tn), g(Tn * M), v(Tn * M);
    for (int64_t n = b; n < e; ++n) {
      head.load(Q, K, nullptr, n);
      head.products(PX.data(), 2 * Tn, true, blas);
      const T *P = PX.data(), *X = PX.data() + Tn * Tn, *beta = a.beta + n * Tn;
      const T *dO = G + n * Tn * M, *u = U + n * Tn * M;
      for (int64_t t = 0; t < Tn; ++t)
        for (int64_t s = 0; s < Tn; ++s) Pt[s * Tn + t] = P[t * Tn + s];
      fw::mm_ab(Tn, M, Tn, Pt.data(), dO, g.data(), blas);  // dU = P^T dO, back-substituted in place into G:
      for (int64_t t = Tn - 1; t >= 0; --t) {  // g_t = du_t - sum_{s>t} beta_s X_st g_s
        T* __restrict__ gt = g.data() + t * M;
        for (int64_t s = t + 1; s < Tn; ++s) axpy(gt, -beta[s] * X[s * Tn + t], g.data() + s * M, M);
      }
      fw::mm_abt(Tn, Tn, M, dO, u, dP.data(), blas);  // dP = tril(dO U^T)
      fw::mm_abt(Tn, Tn, M, g.data(), u, dX.data(), blas);  // G U^T = -dA, into dX's buffer
      fw::gather(a.V, n, Tn, M, v.data());
      for (int64_t t = 0; t < Tn; ++t) {
        std::fill(dP.data() + t * Tn + t + 1, dP.data() + (t + 1) * Tn, T(0));
        T* __restrict__ dx = dX.data() + t * Tn;
        T total = fw::dot(v.data() + t * M, g.data() + t * M, M);  // dbeta_t = v_t . g_t + sum_{s<t} dA_ts X_ts
        for (int64_t s = 0; s < t; ++s) {
          total -= dx[s] * X[t * Tn + s];
          dx[s] *= -beta[t];  // dX_ts = beta_t dA_ts
        }
        std::fill(dx + t, dx + Tn, T(0));
        DB[n * Tn + t] = total;
        for (int64_t m = 0; m < M; ++m) DV[(n * Tn + t) * M + m] = beta[t] * g[t * M + m];
      }
      head.back(dP.data(), dX.data(), nullptr, n, DQ, DK, blas);
    }
  });
}

// One clone set per dtype, overloaded so that AT_DISPATCH's scalar_t picks it (kernels.h).
FW_CLONES void forward_range(const Heads<const float>& Q, const Heads<const float>& K, const DeltaArgs<float>& a,
                             float* out, float* U, const Shape& x, bool blas, int64_t b, int64_t e) {
  forward_range_of(Q, K, a, out, U, x, blas, b, e);
}
FW_CLONES void forward_range(const Heads<const double>& Q, const Heads<const double>& K, const DeltaArgs<double>& a,
                             double* out, double* U, const Shape& x, bool blas, int64_t b, int64_t e) {
  forward_range_of(Q, K, a, out, U, x, blas, b, e);
}
FW_CLONES void backward_range(const float* G, const float* U, const Heads<const float>& Q, const Heads<const float>& K,
                              const DeltaArgs<float>& a, const Heads<float>& DQ, const Heads<float>& DK, float* DV,
                              float* DB, const Shape& x, bool blas, int64_t b, int64_t e) {
  backward_range_of(G, U, Q, K, a, DQ, DK, DV, DB, x, blas, b, e);
}
FW_CLONES void backward_range(const double* G, const double* U, const Heads<const double>& Q,
                              const Heads<const double>& K, const DeltaArgs<double>& a, const Heads<double>& DQ,
                              const Heads<double>& DK, double* DV, double* DB, const Shape& x, bool blas, int64_t b,
                              int64_t e) {
  backward_range_of(G, U, Q, K, a, DQ, DK, DV, DB, x, blas, b, e);
}

// the checked call, and v (M contiguous) and beta (contiguous) in q's dtype
struct DeltaCall : Call {
  torch::Tensor v, beta;
  DeltaCall(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v_, const torch::Tensor& beta_,
            int64_t map, int64_t nu, int64_t norm, double eps, bool blas, const char* fn)
      : Call(q, k, c10::nullopt, map, nu, true, norm, eps, blas, fn) {
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
                                                               int64_t map, int64_t nu, int64_t norm, double eps,
                                                               bool blas) {
  const DeltaCall c(q, k, v, beta, map, nu, norm, eps, blas, "delta_attend_forward");
  auto out = torch::empty({c.B, c.H, c.s.Tk, c.v.size(3)}, c.q.options());  // O
  auto writes = torch::empty_like(out);  // U
  AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "delta_attend_forward", [&] {
    const auto Q = heads_of<const scalar_t>(c.q), K = heads_of<const scalar_t>(c.k);
    const auto a = c.args<scalar_t>();
    scalar_t *O = out.data_ptr<scalar_t>(), *U = writes.data_ptr<scalar_t>();
    at::parallel_for(0, c.B * c.H, fw::kHeadGrain, [&](int64_t b, int64_t e) {
      forward_range(Q, K, a, O, U, c.s, c.blas, b, e);
    });
  });
  return {out, writes};
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> delta_attend_backward(
    const torch::Tensor& grad, const torch::Tensor& writes, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const torch::Tensor& beta, int64_t map, int64_t nu, int64_t norm, double eps, bool blas) {
  const DeltaCall c(q, k, v, beta, map, nu, norm, eps, blas, "delta_attend_backward");
  const std::vector<int64_t> rows{c.B, c.H, c.s.Tk, c.v.size(3)};
  TORCH_CHECK(grad.sizes() == rows && writes.sizes() == rows,
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
      backward_range(G, U, Q, K, a, DQ, DK, DV, DB, c.s, c.blas, b, e);
    });
  });
  return {dq, dk, dv, dbeta};
}
