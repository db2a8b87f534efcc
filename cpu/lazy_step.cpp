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

template <typename T>
inline __attribute__((always_inline)) void lazy_rows(const Step<T>& a, int64_t begin, int64_t end) {
  const int64_t E = a.nu ? 2 * a.d * a.nu : a.d;
  std::vector<T> S(2 * a.t), r_ext(a.nu ? fw::scores_scratch(a.d, a.nu) : 0), past(2 * a.M);
  for (int64_t n = begin; n < end; ++n) {
    const int64_t b = n / a.H, h = n % a.H, source = a.order ? a.order[b] : b;
    lazy_head(a.Q + n * E, a.Kq + n * E, a.V + n * a.M, a.beta ? a.beta + n : nullptr,
              a.K + source * a.kc.b + h * a.kc.h, a.kc.s, a.W + source * a.wc.b + h * a.wc.h, a.wc.s,
              a.C ? a.C + b * a.cc.b + h * a.cc.h : nullptr, a.cc.s,
              a.Kout ? a.Kout + b * a.koc.b + h * a.koc.h : nullptr, a.koc.s,
              a.Wout ? a.Wout + b * a.woc.b + h * a.woc.h : nullptr, a.woc.s, a.key ? a.key + n * a.d : nullptr,
              a.norm, a.eps, a.t, a.d, a.nu, a.M, a.O + n * a.M,
              a.U + n * a.M, S.data(), r_ext.data(), past.data());
  }
}

FW_CLONES void lazy_range(const Step<float>& a, int64_t b, int64_t e) { lazy_rows(a, b, e); }
FW_CLONES void lazy_range(const Step<double>& a, int64_t b, int64_t e) { lazy_rows(a, b, e); }

Cache strides(const torch::Tensor& x) { return x.defined() ? Cache{x.stride(0), x.stride(1), x.stride(2)} : Cache{0, 0, 0}; }

// out [B, H, positions, width] of the cache's dtype, its last dim contiguous, written in place (a view of a spare
// storage, or of the cache's own when nothing is reordered)
void check_out(const c10::optional<torch::Tensor>& out, const torch::Tensor& cache, int64_t B, int64_t positions,
               const char* name) {
  TORCH_CHECK(out->dim() == 4 && out->size(0) == B && out->size(1) == cache.size(1) && out->size(2) == positions &&
                  out->size(3) == cache.size(3) && out->stride(3) == 1 && out->scalar_type() == cache.scalar_type(),
              "lazy_step: ", name, " must be [B, H, ", positions, ", width] like the cache, its last dim contiguous");
}

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
  TORCH_CHECK(keys.dim() == 4 && writes.dim() == 4 && keys.device().is_cpu(),
              "lazy_step: keys and writes must be [B, H, t, d] and [B, H, t, M] CPU tensors");
  const int64_t B = order ? order->numel() : keys.size(0), H = keys.size(1), t = keys.size(2), d = keys.size(3);
  const int64_t M = writes.size(3), E = nu ? 2 * d * nu : d;
  const auto type = keys.scalar_type();
  TORCH_CHECK(type == torch::kFloat || type == torch::kDouble, "lazy_step: keys must be float32 or float64");
  TORCH_CHECK(nu >= 0 && nu <= 2 * d - 1, "lazy_step: nu must be in 0..2d-1, got ", nu);
  TORCH_CHECK(nu || norm == fw::kNone, "lazy_step: a cache of features (nu 0) keeps its writes unscaled");
  TORCH_CHECK(writes.size(0) == keys.size(0) && writes.size(1) == H && writes.size(2) == t && writes.scalar_type() == type,
              "lazy_step: writes must be [B, H, t, M] of the keys' dtype");
  TORCH_CHECK(phi_q.numel() == B * H * E && phi_k.numel() == B * H * E && v.numel() == B * H * M,
              "lazy_step: phi_q, phi_k must be [B, H, 1, 2 d nu] and v [B, H, 1, M]");
  TORCH_CHECK(norm == fw::kNone || norm == fw::kSum || norm == fw::kL2, "lazy_step: norm must be 0, 1 or 2");
  const auto qc = phi_q.to(type).contiguous(), kqc = phi_k.to(type).contiguous(), vc = v.to(type).contiguous();
  const auto bc = beta ? beta->to(type).contiguous() : torch::Tensor();
  TORCH_CHECK(!beta || bc.numel() == B * H, "lazy_step: beta must be [B, H, 1]");
  const auto kv = last_contiguous(keys), wv = last_contiguous(writes);
  const auto cv = decay ? decay->to(type) : torch::Tensor();
  TORCH_CHECK(!decay || (cv.dim() == 3 && cv.size(0) == B && cv.size(1) == H && cv.size(2) == t),
              "lazy_step: decay must be [B, H, t]");
  const auto oc = order ? checked_order(*order, B, keys.size(0), "lazy_step") : torch::Tensor();
  const auto nc = key ? key->to(type).contiguous() : torch::Tensor();
  TORCH_CHECK(!key || nc.numel() == B * H * d, "lazy_step: key must be [B, H, 1, d]");
  const bool outs = keys_out.has_value();
  TORCH_CHECK(outs == writes_out.has_value() && (outs || !order) && (outs || !key),
              "lazy_step: a reorder or an append takes both keys_out and writes_out");
  if (outs) {
    check_out(keys_out, keys, B, key ? t + 1 : t, "keys_out");
    check_out(writes_out, writes, B, key ? t + 1 : t, "writes_out");
  }
  auto o = torch::empty({B, H, 1, M}, keys.options()), u = torch::empty({B, H, 1, M}, keys.options());
  AT_DISPATCH_FLOATING_TYPES(type, "lazy_step", [&] {
    Step<scalar_t> a{qc.data_ptr<scalar_t>(), kqc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(),
                     beta ? bc.data_ptr<scalar_t>() : nullptr, kv.data_ptr<scalar_t>(), wv.data_ptr<scalar_t>(),
                     decay ? cv.data_ptr<scalar_t>() : nullptr,
                     outs ? keys_out->data_ptr<scalar_t>() : nullptr, outs ? writes_out->data_ptr<scalar_t>() : nullptr,
                     o.data_ptr<scalar_t>(), u.data_ptr<scalar_t>(), strides(kv), strides(wv), strides(cv),
                     outs ? strides(*keys_out) : Cache{0, 0, 0}, outs ? strides(*writes_out) : Cache{0, 0, 0},
                     order ? oc.data_ptr<int64_t>() : nullptr, key ? nc.data_ptr<scalar_t>() : nullptr, norm,
                     static_cast<scalar_t>(eps), H, t, d, nu, M};
    at::parallel_for(0, B * H, 4, [&](int64_t b, int64_t e) { lazy_range(a, b, e); });
  });
  return {o, u};
}
