// A decoding step of the lazy cache (fw_fairseq/modules/decoder_state.py's lazy_step, the same function), in one
// pass over the cache and one call instead of about fifteen small ops. The cache keeps DPFP-nu's raw keys (phi
// formed while they are scored, dpfp_rows.h) or, with nu 0, the features themselves (ELU+1, FAVOR+). Per head:
//   a_s = phi(q) . phi(K_s) c_s,   b_s = phi(k) . phi(K_s) c_s        (c_s: the decay, 1 without one)
//   u = beta (v - sum_s b_s W_s)  (delta rules)   or   u = v  (sum rule: beta absent)
//   o = sum_s a_s W_s + (phi(q) . phi(k)) u
// K [t, d] the cached keys (d = E with nu 0), W [t, M] the cached writes (already multiplied by the keys' normalisation).
// With `order` (beam search's reorder, left to this step) hypothesis b reads the cache of row order[b] and
// copies it into keys_out / writes_out as it goes: the reorder costs no pass of its own over the cache.
// With `key` (generation) the step also appends itself: position t of keys_out and writes_out (views of t + 1
// positions; without `order`, of the caches' own storages) gets the raw key and u / max(norm_of(phi(key)), eps),
// the scale the cache keeps its writes in; in Python the scale and the two appends cost a step more than this.
// raw_lazy_step takes the raw rows q, k [B, H, 1, d] instead of phi: per head the map's row form (map_rows.h) forms
// phi(q) and phi(k), normalised by the rule's norm, the sum rule's values get their z column (u = [v; 1]) and its read
// is divided by it; DPFP's cache keeps the raw key, the other maps' their phi(k). In Python those are six small ops
// and their tensors a layer-step (phi of q and k, the z column's append and division, the heads' views).
#include "attend_heads.h"
#include "kernels.h"
#include "dot.h"
#include "dpfp_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace {

template <typename T>
inline __attribute__((always_inline)) void lazy_head(const T* q, const T* k, const T* v, const T* beta, const T* K,
                                                     int64_t ks, const T* W, int64_t ws, const T* C, int64_t cs,
                                                     T* Kout, int64_t kos, T* Wout, int64_t wos, const T* key,
                                                     int64_t norm, T eps, int64_t t, int64_t d, int64_t nu, int64_t M,
                                                     T* o, T* u, T* S, T* r_ext, T* past) {
  const int64_t E = nu ? 2 * d * nu : d, R = beta ? 2 : 1;
  const T* rows[2] = {q, k};
  if (nu && beta) {
    fw::scores_rows<T, 2>(rows, K, S, t, ks, d, nu, r_ext);
  } else if (nu) {
    fw::scores_rows<T, 1>(rows, K, S, t, ks, d, nu, r_ext);
  } else if (beta) {
    fw::feature_scores<T, 2>(rows, K, S, t, ks, d, t);
  } else {
    fw::feature_scores<T, 1>(rows, K, S, t, ks, d, t);
  }
  T* __restrict__ read_q = past;  // sum_s a_s W_s
  T* __restrict__ read_k = past + M;  // sum_s b_s W_s
  if (Kout && Kout != K)  // the keys just scored are in cache: their copy is cheap
    for (int64_t s = 0; s < t; ++s) std::copy(K + s * ks, K + s * ks + d, Kout + s * kos);
  for (int64_t m = 0; m < R * M; ++m) past[m] = T(0);
  for (int64_t s = 0; s < t; ++s) {
    const T c = C ? C[s * cs] : T(1);
    const T* __restrict__ w = W + s * ws;
    if (Wout && Wout != W) std::copy(w, w + M, Wout + s * wos);
    const T a = S[s] * c;
    if (beta) {
      const T b = S[t + s] * c;
#pragma GCC ivdep
      for (int64_t m = 0; m < M; ++m) {
        read_q[m] += a * w[m];
        read_k[m] += b * w[m];
      }
    } else {
#pragma GCC ivdep
      for (int64_t m = 0; m < M; ++m) read_q[m] += a * w[m];
    }
  }
  const T qk = fw::dot(q, k, E);
  for (int64_t m = 0; m < M; ++m) u[m] = beta ? *beta * (v[m] - past[M + m]) : v[m];
  for (int64_t m = 0; m < M; ++m) o[m] = past[m] + qk * u[m];
  if (key) {
    const T scale = norm == fw::kNone ? T(1) : T(1) / std::max(fw::phi_size(key, d, nu, norm, r_ext), eps);
    std::copy(key, key + d, Kout + t * kos);
    for (int64_t m = 0; m < M; ++m) Wout[t * wos + m] = u[m] * scale;
  }
}

struct Cache {  // a [B, H, t, width] view's base and strides (width contiguous); base null: absent
  int64_t b, h, s;
};

template <typename T>
struct Step {  // one call's tensors: rows [B H, 1, .] contiguous, caches as strided views
  const T *Q, *Kq, *V, *beta, *K, *W, *C;
  T *Kout, *Wout, *O, *U;
  Cache kc, wc, cc, koc, woc;
  const int64_t* order;  // hypothesis b reads the cache row order[b] (null: b)
  const T* key;  // the raw keys [B H, d] to append (null: no append)
  int64_t norm;
  T eps;
  int64_t H, t, d, nu, M;
};

// the cache's rows of head n: hypothesis n / H reads row order[n / H] (itself without a reorder)
template <typename T>
struct HeadCaches {
  const T *K, *W, *C;
  T *Kout, *Wout;
  HeadCaches(const Step<T>& a, int64_t n) {
    const int64_t b = n / a.H, h = n % a.H, source = a.order ? a.order[b] : b;
    K = a.K + source * a.kc.b + h * a.kc.h;
    W = a.W + source * a.wc.b + h * a.wc.h;
    C = a.C ? a.C + b * a.cc.b + h * a.cc.h : nullptr;
    Kout = a.Kout ? a.Kout + b * a.koc.b + h * a.koc.h : nullptr;
    Wout = a.Wout ? a.Wout + b * a.woc.b + h * a.woc.h : nullptr;
  }
};

template <typename T>
inline __attribute__((always_inline)) void lazy_rows(const Step<T>& a, int64_t begin, int64_t end) {
  std::vector<T> S(2 * a.t), r_ext(a.nu ? fw::scores_scratch(a.d, a.nu) : 0), past(2 * a.M);
  const int64_t E = a.nu ? 2 * a.d * a.nu : a.d;
  for (int64_t n = begin; n < end; ++n) {
    const HeadCaches<T> c(a, n);
    lazy_head(a.Q + n * E, a.Kq + n * E, a.V + n * a.M, a.beta ? a.beta + n : nullptr, c.K, a.kc.s, c.W, a.wc.s, c.C,
              a.cc.s, c.Kout, a.koc.s, c.Wout, a.woc.s, a.key ? a.key + n * a.d : nullptr, a.norm, a.eps, a.t, a.d,
              a.nu, a.M, a.O + n * a.M, a.U + n * a.M, S.data(), r_ext.data(), past.data());
  }
}

// raw_lazy_step's heads [begin, end): Step's Q and Kq are the raw rows [B H, d] and V [B H, D] (D = M - 1 with the
// z column), O [B H, D]; map: the row form of s's map
template <typename T, typename Row>
inline __attribute__((always_inline)) void raw_rows(const Step<T>& a, const fw::Shape& s, Row& map, bool z, T z_eps,
                                                    int64_t begin, int64_t end) {
  const int64_t d = s.d, E = map.width(), D = z ? a.M - 1 : a.M;
  std::vector<T> x(2 * d), phi(2 * E), v(a.M), o(a.M), u(a.M);
  std::vector<T> S(2 * a.t), r_ext(a.nu ? fw::scores_scratch(d, a.nu) : 0), past(2 * a.M);
  for (int64_t n = begin; n < end; ++n) {
    const HeadCaches<T> c(a, n);
    std::copy(a.Q + n * d, a.Q + (n + 1) * d, x.data());  // [q; k]: row 0 the query's (FAVOR+'s shift)
    std::copy(a.Kq + n * d, a.Kq + (n + 1) * d, x.data() + d);
    map.begin(x.data(), 2, 1);
    fw::forward_rows(map, x.data(), phi.data(), s.norm, s.eps, 0, 2);  // [phi(q); phi(k)] [2, E]
    std::copy(a.V + n * D, a.V + (n + 1) * D, v.data());
    if (z) v[D] = T(1);
    // DPFP's cache (nu > 0) keeps the raw key and scales its write by phi's norm; a cache of features keeps phi(k)
    lazy_head(phi.data(), phi.data() + E, v.data(), a.beta ? a.beta + n : nullptr, c.K, a.kc.s, c.W, a.wc.s, c.C,
              a.cc.s, c.Kout, a.koc.s, c.Wout, a.woc.s, a.nu ? x.data() + d : phi.data() + E,
              a.nu ? s.norm : fw::kNone, a.eps, a.t, a.d, a.nu, a.M, o.data(), u.data(), S.data(), r_ext.data(),
              past.data());
    T* __restrict__ out = a.O + n * D;
    const T s_t = z ? o[D] + z_eps : T(1);  // y = numerator / (z . phi(q) + Z_EPS), as divide_by_z divides
    for (int64_t m = 0; m < D; ++m) out[m] = o[m] / s_t;
  }
}

FW_CLONES void lazy_range(const Step<float>& a, int64_t b, int64_t e) { lazy_rows(a, b, e); }
FW_CLONES void lazy_range(const Step<double>& a, int64_t b, int64_t e) { lazy_rows(a, b, e); }

template <typename T>
inline __attribute__((always_inline)) void raw_range_of(const Step<T>& a, const fw::Shape& s, bool z, T z_eps,
                                                        int64_t b, int64_t e) {
  fw::with_row<T>(s, [&](auto map) __attribute__((always_inline)) { raw_rows(a, s, map, z, z_eps, b, e); });
}
FW_CLONES void raw_range(const Step<float>& a, const fw::Shape& s, bool z, float z_eps, int64_t b, int64_t e) {
  raw_range_of(a, s, z, z_eps, b, e);
}
FW_CLONES void raw_range(const Step<double>& a, const fw::Shape& s, bool z, double z_eps, int64_t b, int64_t e) {
  raw_range_of(a, s, z, z_eps, b, e);
}

Cache strides(const torch::Tensor& x) { return x.defined() ? Cache{x.stride(0), x.stride(1), x.stride(2)} : Cache{0, 0, 0}; }

// out [B, H, positions, width] of the cache's dtype, its last dim contiguous, written in place (a view of a spare
// storage, or of the cache's own when nothing is reordered)
void check_out(const c10::optional<torch::Tensor>& out, const torch::Tensor& cache, int64_t B, int64_t positions,
               const char* fn, const char* name) {
  TORCH_CHECK(out->dim() == 4 && out->size(0) == B && out->size(1) == cache.size(1) && out->size(2) == positions &&
                  out->size(3) == cache.size(3) && out->stride(3) == 1 && out->scalar_type() == cache.scalar_type(),
              fn, ": ", name, " must be [B, H, ", positions, ", width] like the cache, its last dim contiguous");
}

// What both steps take from their arguments, checked: the caches (keys [B', H, t, C], writes [B', H, t, M]), the
// values v [B, H, 1, D], beta, the decay, the reorder and the outs (with `append`, of t + 1 positions)
struct StepArgs {
  torch::Tensor kv, wv, cv, oc, bc, vc, ko, wo;  // ko, wo: keys_out and writes_out (undefined: none)
  int64_t B, H, t, C, M;
  torch::ScalarType type;
  bool outs;

  StepArgs(const torch::Tensor& keys, const torch::Tensor& writes, const torch::Tensor& v,
           const c10::optional<torch::Tensor>& beta, const c10::optional<torch::Tensor>& decay,
           const c10::optional<torch::Tensor>& order, const c10::optional<torch::Tensor>& keys_out,
           const c10::optional<torch::Tensor>& writes_out, bool append, int64_t D, const char* fn) {
    TORCH_CHECK(keys.dim() == 4 && writes.dim() == 4 && keys.device().is_cpu(), fn,
                ": keys and writes must be [B, H, t, d] and [B, H, t, M] CPU tensors");
    B = order ? order->numel() : keys.size(0);
    H = keys.size(1);
    t = keys.size(2);
    C = keys.size(3);
    M = writes.size(3);
    type = keys.scalar_type();
    TORCH_CHECK(type == torch::kFloat || type == torch::kDouble, fn, ": keys must be float32 or float64");
    TORCH_CHECK(writes.size(0) == keys.size(0) && writes.size(1) == H && writes.size(2) == t &&
                    writes.scalar_type() == type,
                fn, ": writes must be [B, H, t, M] of the keys' dtype");
    TORCH_CHECK(v.numel() == B * H * D, fn, ": v must be [B, H, 1, ", D, "]");
    vc = v.to(type).contiguous();
    bc = beta ? beta->to(type).contiguous() : torch::Tensor();
    TORCH_CHECK(!beta || bc.numel() == B * H, fn, ": beta must be [B, H, 1]");
    kv = last_contiguous(keys);
    wv = last_contiguous(writes);
    cv = decay ? decay->to(type) : torch::Tensor();
    TORCH_CHECK(!decay || (cv.dim() == 3 && cv.size(0) == B && cv.size(1) == H && cv.size(2) == t), fn,
                ": decay must be [B, H, t]");
    oc = order ? checked_order(*order, B, keys.size(0), fn) : torch::Tensor();
    outs = keys_out.has_value();
    TORCH_CHECK(outs == writes_out.has_value() && (outs || !order) && (outs || !append), fn,
                ": a reorder or an append takes both keys_out and writes_out");
    if (outs) {
      check_out(keys_out, keys, B, append ? t + 1 : t, fn, "keys_out");
      check_out(writes_out, writes, B, append ? t + 1 : t, fn, "writes_out");
      ko = *keys_out;
      wo = *writes_out;
    }
  }

  // the Step over these tensors, with the rows Q, Kq [B H, .], the appended keys (or null), O and U
  template <typename T>
  Step<T> step(const T* Q, const T* Kq, const T* key, T* O, T* U, int64_t norm, double eps, int64_t nu) const {
    return Step<T>{Q, Kq, vc.data_ptr<T>(), bc.defined() ? bc.data_ptr<T>() : nullptr, kv.data_ptr<T>(),
                   wv.data_ptr<T>(), cv.defined() ? cv.data_ptr<T>() : nullptr,
                   outs ? ko.data_ptr<T>() : nullptr, outs ? wo.data_ptr<T>() : nullptr, O, U, strides(kv),
                   strides(wv), strides(cv), strides(ko), strides(wo), oc.defined() ? oc.data_ptr<int64_t>() : nullptr,
                   key, norm, static_cast<T>(eps), H, t, C, nu, M};
  }
};

}  // namespace

// phi_q, phi_k [B, H, 1, E]; v [B, H, 1, M]; beta [B, H, 1] or None (sum rule); keys [B', H, t, d];
// writes [B', H, t, M]; decay [B, H, t] or None (already in the hypotheses' order); order [B] rows of the
// caches or None (B' = B); keys_out / writes_out [B, H, t, .] their reordered copies (with order), or
// [B, H, t + 1, .] with key [B, H, 1, d], the raw key appended with its write scaled by norm (0 none, 1 sum,
// 2 l2) and eps -> (o, u), each [B, H, 1, M] (u as the rule writes it, before the scale)
std::tuple<torch::Tensor, torch::Tensor> lazy_step(const torch::Tensor& phi_q, const torch::Tensor& phi_k,
                                                        const torch::Tensor& v, const c10::optional<torch::Tensor>& beta,
                                                        const torch::Tensor& keys, const torch::Tensor& writes,
                                                        const c10::optional<torch::Tensor>& decay, int64_t nu,
                                                        const c10::optional<torch::Tensor>& order,
                                                        const c10::optional<torch::Tensor>& keys_out,
                                                        const c10::optional<torch::Tensor>& writes_out,
                                                        const c10::optional<torch::Tensor>& key, int64_t norm,
                                                        double eps) {
  const StepArgs a(keys, writes, v, beta, decay, order, keys_out, writes_out, key.has_value(),
                   writes.dim() == 4 ? writes.size(3) : 0, "lazy_step");
  const int64_t d = a.C, E = nu ? 2 * d * nu : d;
  TORCH_CHECK(nu >= 0 && nu <= 2 * d - 1, "lazy_step: nu must be in 0..2d-1, got ", nu);
  TORCH_CHECK(nu || norm == fw::kNone, "lazy_step: a cache of features (nu 0) keeps its writes unscaled");
  TORCH_CHECK(phi_q.numel() == a.B * a.H * E && phi_k.numel() == a.B * a.H * E,
              "lazy_step: phi_q, phi_k must be [B, H, 1, 2 d nu]");
  TORCH_CHECK(norm == fw::kNone || norm == fw::kSum || norm == fw::kL2, "lazy_step: norm must be 0, 1 or 2");
  const auto qc = phi_q.to(a.type).contiguous(), kqc = phi_k.to(a.type).contiguous();
  const auto nc = key ? key->to(a.type).contiguous() : torch::Tensor();
  TORCH_CHECK(!key || nc.numel() == a.B * a.H * d, "lazy_step: key must be [B, H, 1, d]");
  auto o = torch::empty({a.B, a.H, 1, a.M}, keys.options()), u = torch::empty({a.B, a.H, 1, a.M}, keys.options());
  AT_DISPATCH_FLOATING_TYPES(a.type, "lazy_step", [&] {
    const auto step = a.step<scalar_t>(qc.data_ptr<scalar_t>(), kqc.data_ptr<scalar_t>(),
                                       key ? nc.data_ptr<scalar_t>() : nullptr, o.data_ptr<scalar_t>(),
                                       u.data_ptr<scalar_t>(), norm, eps, nu);
    at::parallel_for(0, a.B * a.H, 4, [&](int64_t b, int64_t e) { lazy_range(step, b, e); });
  });
  return {o, u};
}

// q, k [B, H, 1, d] raw rows; v [B, H, 1, D]; the map (feature_attend_forward's codes, nu, projection) and norm, the
// normalisation of phi(q) and phi(k) (0 for the sum rule), with eps; z_column: the sum rule's (writes M = D + 1 wide,
// the read divided by z . phi(q) + z_eps); keys [B', H, t, C] (C = d for DPFP, else E); keys_out / writes_out
// [B, H, t + 1, .]: the rows read, then this position's row -> o [B, H, 1, D]
torch::Tensor raw_lazy_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                            const c10::optional<torch::Tensor>& beta, const torch::Tensor& keys,
                            const torch::Tensor& writes, const c10::optional<torch::Tensor>& decay, int64_t map,
                            int64_t nu, const c10::optional<torch::Tensor>& projection,
                            const c10::optional<torch::Tensor>& order, const torch::Tensor& keys_out,
                            const torch::Tensor& writes_out, int64_t norm, double eps, bool z_column, double z_eps) {
  const int64_t D = writes.dim() == 4 ? writes.size(3) - (z_column ? 1 : 0) : 0;
  const StepArgs a(keys, writes, v, beta, decay, order, keys_out, writes_out, true, D, "raw_lazy_step");
  TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.size(0) == a.B && q.size(1) == a.H && q.size(2) == 1 &&
                  q.scalar_type() == a.type && k.scalar_type() == a.type,
              "raw_lazy_step: q and k must be [B, H, 1, d] of the keys' dtype");
  fw::Shape s;
  torch::Tensor kept;
  fw::set_map(s, map, nu, projection, norm, q.size(3), a.type, kept, "raw_lazy_step");
  s.eps = eps;
  const int64_t E = fw::width(s);
  const int64_t cached_nu = map == fw::kDpfp ? nu : 0;  // DPFP's cache keeps the raw keys, the others' phi
  TORCH_CHECK(a.C == (cached_nu ? s.d : E), "raw_lazy_step: keys must be [B, H, t, ", cached_nu ? s.d : E, "]");
  const auto qc = q.contiguous(), kc = k.contiguous();
  auto o = torch::empty({a.B, a.H, 1, D}, keys.options());
  AT_DISPATCH_FLOATING_TYPES(a.type, "raw_lazy_step", [&] {
    const auto step = a.step<scalar_t>(qc.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(), nullptr,
                                       o.data_ptr<scalar_t>(), nullptr, norm, eps, cached_nu);
    at::parallel_for(0, a.B * a.H, 4, [&](int64_t b, int64_t e) {
      raw_range(step, s, z_column, static_cast<scalar_t>(z_eps), b, e);
    });
  });
  return o;
}
