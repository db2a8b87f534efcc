// The products of features that a short sequence's read takes, from the raw heads, for the maps with a row form
// (map_rows.h: DPFP-nu, ELU+1, Hedgehog; fw_fairseq/ops/feature_attend.py).
//
// Kind kRead, the sum rule's read: per head, P = mask(phi(q) phi(k)^T) [Tq, T] (mask: s <= t where causal),
// s_t = sum_s P_ts + eps and A = P / s, so that A v = W^T phi(q) / (z . phi(q) + eps) (z = sum_s phi(k_s)).
// Backward from dA [Tq, T]: dP_ts = (dA_ts - sum_r dA_tr A_tr) / s_t (0 where masked).
// Kind kGram, the delta rule's one chunk (README §2): [P; X] [2T, T], P = phi(q) phi(k)^T for s <= t and
// X = phi(k) phi(k)^T for s < t, phi normalised by `norm` (--fw-delta-norm). Backward from [dP; dX].
// Then dphi(q) = dP phi(k), dphi(k) = dP^T phi(q) (+ (dX + dX^T) phi(k)), and the map's backward (with the
// normalisation's) a row at a time.
// phi of a head's queries and keys ([Tq + T, E]) lives in a per-task buffer that stays in cache, never in a
// [B, H, T, E] tensor: on a training batch the map's passes over those tensors and their gradients cost as
// much as the products themselves (fw_fairseq/ops/README.md §12). The products call BLAS (sgemm_/dgemm_) where the
// loaded torch exports it (its x86-64 builds carry MKL: the forward 2 times, the backward 1.6 times faster than the
// AVX2 loops on an AVX-512 CPU, DPFP-2), else the register-blocked loops (products.h); `blas` false takes the loops
// anyway (the tests run both).
// Inputs: q [B, H, Tq, d], k [B, H, T, d] in any layout whose d is contiguous, float32 or float64; key_padding_mask
// [B, T] (optional, true at padding): those keys' rows of phi are 0 (they read nothing, and add nothing to s) and
// their dk is 0; causal (and kGram) needs Tq = T.
#include "kernels.h"
#include "dot.h"
#include "map_rows.h"
#include "products.h"

#include <ATen/Parallel.h>

#include <type_traits>
#include <vector>

namespace {

using fw::blas_found;
using fw::kNone;
using fw::mm_ab;
using fw::mm_abt;

// The two kinds of call: the sum rule's normalised read (A, s), and the delta rule's products (P, X)
enum Kind : int64_t { kRead = 0, kGram = 1 };

struct Shape {
  int64_t Tq, Tk, d, map, nu, norm;  // queries, keys, key width, the map (fw::Map), DPFP's nu, phi's norm (fw::Norm)
  double eps;  // kRead: the z column's guard (Z_EPS); kGram: the normalisation's floor (PHI_EPS)
  int64_t E() const { return map == fw::kDpfp ? 2 * d * nu : map == fw::kElu ? d : 2 * d; }  // map_rows.h's widths
  int64_t out_rows(Kind kind) const { return kind == kRead ? Tq : Tq + Tk; }
};

// The rows of [B, H, T, d] heads in any layout whose d is contiguous (the module's heads are views of [T, B, C]):
// row t of head n = b H + h at data + b sb + h sh + t st. Reading them in place spares a copy of q and k each way,
// and writing dq and dk in q's and k's own layout spares autograd a copy back to [T, B, C].
template <typename P>
struct Heads {
  P* data;
  int64_t H, sb, sh, st;
  P* row(int64_t n, int64_t t) const { return data + (n / H) * sb + (n % H) * sh + t * st; }
};

// the heads of x [B, H, T, d] as Heads<const T> (read) or Heads<T> (written)
template <typename P>
Heads<P> heads_of(const torch::Tensor& x) {
  return Heads<P>{x.data_ptr<std::remove_const_t<P>>(), x.size(1), x.stride(0), x.stride(1), x.stride(2)};
}

// the Tn rows of head n into out [Tn, d]
template <typename T>
inline __attribute__((always_inline)) void gather(const Heads<const T>& X, int64_t n, int64_t Tn, int64_t d, T* out) {
  for (int64_t t = 0; t < Tn; ++t) {
    const T* x = X.row(n, t);
    std::copy(x, x + d, out + t * d);
  }
}

template <typename T>
inline __attribute__((always_inline)) void scatter(const T* rows, const Heads<T>& X, int64_t n, int64_t Tn, int64_t d) {
  for (int64_t t = 0; t < Tn; ++t) std::copy(rows + t * d, rows + (t + 1) * d, X.row(n, t));
}

// the rows [Tn, width] of those of head n's keys that are padding (pad: [B, T], true at padding; null: none) set to 0
template <typename T>
inline __attribute__((always_inline)) void zero_padded(T* rows, const bool* pad, int64_t n, int64_t H, int64_t Tn,
                                                       int64_t width) {
  if (!pad) return;
  const bool* p = pad + (n / H) * Tn;
  for (int64_t t = 0; t < Tn; ++t)
    if (p[t]) std::fill(rows + t * width, rows + (t + 1) * width, T(0));
}

// A head's buffers: its raw rows x [Tq + T, d] (queries', then keys') and phi [Tq + T, E], and the row map
template <typename T, typename Row>
struct HeadBuffers {
  std::vector<T> x, phi;
  Row map;
  HeadBuffers(const Shape& s, Row row) : x((s.Tq + s.Tk) * s.d), phi((s.Tq + s.Tk) * s.E()), map(std::move(row)) {}

  // head n's rows and features, normalised where kGram has a norm; the features of keys at padding zeroed
  // always_inline: called from the FW_CLONES ranges, it must be compiled for each clone's target (AVX2 or not)
  inline __attribute__((always_inline)) void load(const Heads<const T>& Q, const Heads<const T>& K, const bool* pad,
                                                  int64_t n, const Shape& s, Kind kind) {
    gather(Q, n, s.Tq, s.d, x.data());
    gather(K, n, s.Tk, s.d, x.data() + s.Tq * s.d);
    fw::forward_rows(map, x.data(), phi.data(), kind == kGram ? s.norm : kNone, s.eps, 0, s.Tq + s.Tk);
    zero_padded(phi.data() + s.Tq * s.E(), pad, n, Q.H, s.Tk, s.E());
  }
};

// heads [b, e). kRead: A [Tq, T] into out and s [Tq] into S; kGram: [P; X] [Tq + T, T] into out, P = phi(q) phi(k)^T
// with s <= t, X = phi(k) phi(k)^T with s < t (both causal: Tq = T)
template <typename T, typename Row>
inline __attribute__((always_inline)) void forward_heads(Row row, const Heads<const T>& Q, const Heads<const T>& K,
                                                         const bool* pad, T* out, T* S, const Shape& x, Kind kind,
                                                         bool causal, bool blas, int64_t b, int64_t e) {
  const int64_t E = x.E(), Tq = x.Tq, Tk = x.Tk, rows = x.out_rows(kind);
  HeadBuffers<T, Row> head(x, std::move(row));
  for (int64_t n = b; n < e; ++n) {
    head.load(Q, K, pad, n, x, kind);
    T* P = out + n * rows * Tk;
    const T* phi = head.phi.data();
    mm_abt(rows, Tk, E, phi, phi + Tq * E, P, blas);  // [phi(q) (; phi(k))] phi(k)^T
    for (int64_t t = 0; t < rows; ++t) {
      T* __restrict__ row = P + t * Tk;
      const int64_t seen = t < Tq ? (causal ? t + 1 : Tk) : t - Tq;  // X: the keys before the key
      for (int64_t j = seen; j < Tk; ++j) row[j] = T(0);
      if (kind == kGram) continue;
      const T s = fw::sum(row, seen) + T(x.eps);
      const T inv = T(1) / s;
      for (int64_t j = 0; j < seen; ++j) row[j] *= inv;
      S[n * Tq + t] = s;
    }
  }
}

// heads [b, e): dq [Tq, d] and dk [T, d] of each from the gradient of forward_heads' out (and A and s for kRead):
// dphi(q) = dP phi(k), dphi(k) = [dP^T, dX + dX^T] [phi(q); phi(k)] (dX only for kGram); a padded key's dk is 0
template <typename T, typename Row>
inline __attribute__((always_inline)) void backward_heads(Row row, const T* G, const T* A, const T* S,
                                                          const Heads<const T>& Q, const Heads<const T>& K,
                                                          const bool* pad, const Heads<T>& DQ, const Heads<T>& DK,
                                                          const Shape& x, Kind kind, bool causal, bool blas, int64_t b,
                                                          int64_t e) {
  const int64_t E = x.E(), Tq = x.Tq, Tk = x.Tk, rows = x.out_rows(kind), inner = kind == kGram ? Tq + Tk : Tq;
  HeadBuffers<T, Row> head(x, std::move(row));
  std::vector<T> dphi((Tq + Tk) * E), dP(Tq * Tk), coef(Tk * inner), dx((Tq + Tk) * x.d);
  for (int64_t n = b; n < e; ++n) {
    const T* g = G + n * rows * Tk;
    head.load(Q, K, pad, n, x, kind);
    for (int64_t t = 0; t < Tq; ++t) {  // dP, 0 where masked; kRead through the rows' normalisation
      const T* __restrict__ gt = g + t * Tk;
      T* __restrict__ dp = dP.data() + t * Tk;
      const int64_t seen = causal ? t + 1 : Tk;
      const T inv = kind == kRead ? T(1) / S[n * Tq + t] : T(1);
      const T c = kind == kRead ? fw::dot(gt, A + (n * Tq + t) * Tk, seen) : T(0);
      for (int64_t j = 0; j < seen; ++j) dp[j] = (gt[j] - c) * inv;
      for (int64_t j = seen; j < Tk; ++j) dp[j] = T(0);
    }
    for (int64_t s = 0; s < Tk; ++s) {  // coef [T, inner] = [dP^T, dX + dX^T], dX strictly lower
      T* __restrict__ row = coef.data() + s * inner;
      for (int64_t t = 0; t < Tq; ++t) row[t] = dP[t * Tk + s];
      if (kind == kRead) continue;
      const T* dX = g + Tq * Tk;
      for (int64_t r = 0; r < Tk; ++r) row[Tq + r] = r < s ? dX[s * Tk + r] : r > s ? dX[r * Tk + s] : T(0);
    }
    const T* phi = head.phi.data();
    mm_ab(Tq, E, Tk, dP.data(), phi + Tq * E, dphi.data(), blas);
    mm_ab(Tk, E, inner, coef.data(), phi, dphi.data() + Tq * E, blas);
    fw::backward_rows(head.map, dphi.data(), head.x.data(), dx.data(), kind == kGram ? x.norm : kNone, x.eps, 0,
                      Tq + Tk);
    zero_padded(dx.data() + Tq * x.d, pad, n, Q.H, Tk, x.d);  // their phi was the constant 0
    scatter(dx.data(), DQ, n, Tq, x.d);
    scatter(dx.data() + Tq * x.d, DK, n, Tk, x.d);
  }
}

// The heads' work with the Shape's map as its row type: the one place where a map's code picks its row form
// (map_rows.h), so that each clone compiles each map's rows inline
template <typename T, typename Work>
inline __attribute__((always_inline)) void with_row(const Shape& x, Work work) {
  switch (x.map) {
    case fw::kDpfp: return work(fw::DpfpRow<T>(x.d, x.nu));
    case fw::kElu: return work(fw::EluRow<T>(x.d));
    default: return work(fw::HedgehogRow<T>(x.d));
  }
}

// One clone set per dtype, overloaded so that AT_DISPATCH's scalar_t picks it (kernels.h).
template <typename T>
inline __attribute__((always_inline)) void forward_any(const Heads<const T>& Q, const Heads<const T>& K,
                                                       const bool* pad, T* out, T* S, const Shape& x, Kind kind,
                                                       bool causal, bool blas, int64_t b, int64_t e) {
  with_row<T>(x, [&](auto row) __attribute__((always_inline)) {
    forward_heads(std::move(row), Q, K, pad, out, S, x, kind, causal, blas, b, e);
  });
}
template <typename T>
inline __attribute__((always_inline)) void backward_any(const T* G, const T* A, const T* S, const Heads<const T>& Q,
                                                        const Heads<const T>& K, const bool* pad, const Heads<T>& DQ,
                                                        const Heads<T>& DK, const Shape& x, Kind kind, bool causal,
                                                        bool blas, int64_t b, int64_t e) {
  with_row<T>(x, [&](auto row) __attribute__((always_inline)) {
    backward_heads(std::move(row), G, A, S, Q, K, pad, DQ, DK, x, kind, causal, blas, b, e);
  });
}
FW_CLONES void forward_range(const Heads<const float>& Q, const Heads<const float>& K, const bool* pad, float* out,
                             float* S, const Shape& x, Kind kind, bool causal, bool blas, int64_t b, int64_t e) {
  forward_any(Q, K, pad, out, S, x, kind, causal, blas, b, e);
}
FW_CLONES void forward_range(const Heads<const double>& Q, const Heads<const double>& K, const bool* pad, double* out,
                             double* S, const Shape& x, Kind kind, bool causal, bool blas, int64_t b, int64_t e) {
  forward_any(Q, K, pad, out, S, x, kind, causal, blas, b, e);
}
FW_CLONES void backward_range(const float* G, const float* A, const float* S, const Heads<const float>& Q,
                              const Heads<const float>& K, const bool* pad, const Heads<float>& DQ,
                              const Heads<float>& DK, const Shape& x, Kind kind, bool causal, bool blas, int64_t b,
                              int64_t e) {
  backward_any(G, A, S, Q, K, pad, DQ, DK, x, kind, causal, blas, b, e);
}
FW_CLONES void backward_range(const double* G, const double* A, const double* S, const Heads<const double>& Q,
                              const Heads<const double>& K, const bool* pad, const Heads<double>& DQ,
                              const Heads<double>& DK, const Shape& x, Kind kind, bool causal, bool blas, int64_t b,
                              int64_t e) {
  backward_any(G, A, S, Q, K, pad, DQ, DK, x, kind, causal, blas, b, e);
}

void check(const torch::Tensor& q, const torch::Tensor& k, int64_t map, int64_t nu, int64_t kind, bool causal,
           int64_t norm, const char* fn) {
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu(), fn, ": q and k must be CPU tensors");
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), fn, ": q and k must share a dtype");
  TORCH_CHECK(q.scalar_type() == torch::kFloat || q.scalar_type() == torch::kDouble, fn,
              ": q and k must be float32 or float64");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && q.size(0) == k.size(0) && q.size(1) == k.size(1) &&
                  q.size(3) == k.size(3) && q.size(3) >= 1,
              fn, ": q and k must be [B, H, Tq, d] and [B, H, T, d]");
  TORCH_CHECK(map == fw::kDpfp || map == fw::kElu || map == fw::kHedgehog, fn,
              ": map must be 0 (dpfp), 1 (elu) or 2 (hedgehog)");
  TORCH_CHECK(map != fw::kDpfp || (nu >= 1 && nu <= 2 * q.size(3) - 1), fn, ": nu must be in 1..2d-1");
  TORCH_CHECK(kind == kRead || kind == kGram, fn, ": kind must be 0 (the sum rule's read) or 1 (the products)");
  TORCH_CHECK(kind == kRead || causal, fn, ": the products (kind 1) are causal");
  TORCH_CHECK(norm == kNone || (kind == kGram && (norm == fw::kSum || norm == fw::kL2)), fn,
              ": norm must be 0, or 1 (sum) or 2 (l2) with kind 1");
  TORCH_CHECK(!causal || q.size(2) == k.size(2), fn, ": causal needs as many queries as keys");
  TORCH_CHECK(q.size(2) >= 1 && k.size(2) >= 1, fn, ": q and k need at least one position");
  // BLAS takes int sizes: a head's [Tq + T, E] features must fit (E <= 2 d nu, or 2 d for the other maps)
  TORCH_CHECK((q.size(2) + k.size(2)) * 2 * q.size(3) * std::max<int64_t>(nu, 1) < (int64_t(1) << 31), fn,
              ": too long for BLAS");
}

// heads a task takes: a head's products are tens of microseconds on a training batch
constexpr int64_t kHeadGrain = 2;

// What both directions take from their arguments, checked: the heads (d contiguous), the key padding mask as a
// contiguous bool [B, T] (or undefined), the shape, and whether the products go to BLAS
struct Call {
  torch::Tensor q, k, pad;
  Shape x;
  int64_t B, H;
  Kind kind;
  bool blas;

  Call(const torch::Tensor& q_, const torch::Tensor& k_, const c10::optional<torch::Tensor>& mask, int64_t map,
       int64_t nu, int64_t kind_, bool causal, int64_t norm, double eps, bool blas_, const char* fn) {
    check(q_, k_, map, nu, kind_, causal, norm, fn);
    q = last_contiguous(q_);
    k = last_contiguous(k_);
    if (mask && mask->defined()) {
      TORCH_CHECK(mask->sizes() == torch::IntArrayRef({k.size(0), k.size(2)}), fn, ": key_padding_mask must be [B, T]");
      pad = mask->to(torch::kBool).contiguous();
    }
    x = Shape{q.size(2), k.size(2), q.size(3), map, nu, norm, eps};
    B = q.size(0);
    H = q.size(1);
    kind = Kind(kind_);
    blas = blas_ && blas_found();
  }

  const bool* pad_data() const { return pad.defined() ? pad.data_ptr<bool>() : nullptr; }
};

}  // namespace

std::tuple<torch::Tensor, torch::Tensor> feature_attend_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                 const c10::optional<torch::Tensor>& key_padding_mask,
                                                                 int64_t map, int64_t nu, int64_t kind, bool causal,
                                                                 int64_t norm, double eps, bool blas) {
  const Call c(q, k, key_padding_mask, map, nu, kind, causal, norm, eps, blas, "feature_attend_forward");
  auto out = torch::empty({c.B, c.H, c.x.out_rows(c.kind), c.x.Tk}, c.q.options());  // A, or [P; X]
  auto sums = torch::empty({c.B, c.H, c.kind == kRead ? c.x.Tq : 0}, c.q.options());  // s
  AT_DISPATCH_FLOATING_TYPES(c.q.scalar_type(), "feature_attend_forward", [&] {
    const auto Q = heads_of<const scalar_t>(c.q), K = heads_of<const scalar_t>(c.k);
    scalar_t *O = out.data_ptr<scalar_t>(), *S = sums.data_ptr<scalar_t>();
    at::parallel_for(0, c.B * c.H, kHeadGrain, [&](int64_t b, int64_t e) {
      forward_range(Q, K, c.pad_data(), O, S, c.x, c.kind, causal, c.blas, b, e);
    });
  });
  return {out, sums};
}

std::tuple<torch::Tensor, torch::Tensor> feature_attend_backward(const torch::Tensor& grad, const torch::Tensor& out,
                                                                  const torch::Tensor& sums, const torch::Tensor& q,
                                                                  const torch::Tensor& k,
                                                                  const c10::optional<torch::Tensor>& key_padding_mask,
                                                                  int64_t map, int64_t nu, int64_t kind, bool causal,
                                                                  int64_t norm, double eps, bool blas) {
  const Call c(q, k, key_padding_mask, map, nu, kind, causal, norm, eps, blas, "feature_attend_backward");
  const bool read = c.kind == kRead;
  const std::vector<int64_t> rows{c.B, c.H, c.x.out_rows(c.kind), c.x.Tk}, row_sums{c.B, c.H, c.x.Tq};
  TORCH_CHECK(grad.sizes() == rows && (!read || (out.sizes() == rows && sums.sizes() == row_sums)),
              "feature_attend_backward: grad (and with kind 0 out) must be feature_attend_forward's out's shape, sums its "
              "s");
  const auto dtype = c.q.scalar_type();
  const auto gc = grad.to(dtype).contiguous();
  // kind 0 reads A and s again (dP's normalisation); kind 1 needs neither
  const auto ac = read ? out.to(dtype).contiguous() : out, sc = read ? sums.to(dtype).contiguous() : sums;
  auto dq = torch::empty_like(c.q), dk = torch::empty_like(c.k);  // in q's and k's layouts where they are dense
  AT_DISPATCH_FLOATING_TYPES(dtype, "feature_attend_backward", [&] {
    const auto Q = heads_of<const scalar_t>(c.q), K = heads_of<const scalar_t>(c.k);
    const auto DQ = heads_of<scalar_t>(dq), DK = heads_of<scalar_t>(dk);
    const scalar_t* G = gc.data_ptr<scalar_t>();
    const scalar_t* A = read ? ac.data_ptr<scalar_t>() : nullptr;
    const scalar_t* S = read ? sc.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, c.B * c.H, kHeadGrain, [&](int64_t b, int64_t e) {
      backward_range(G, A, S, Q, K, c.pad_data(), DQ, DK, c.x, c.kind, causal, c.blas, b, e);
    });
  });
  return {dq, dk};
}

bool feature_attend_blas() { return blas_found(); }
