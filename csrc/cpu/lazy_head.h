// The lazy cache's decoding step per head (lazy_step.cpp; raw_step.cpp forms phi of the raw rows first) and what
// both bindings take from their arguments. A decoding step of the lazy cache (fw_fairseq/decoding/decoder_state.py's lazy_step, the same function), in one
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
#pragma once

#include "kernels.h"
#include "dot.h"
#include "dpfp_rows.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace fw {

// dst[:n] = src[:n] with non-temporal stores where dst and n allow 16-byte ones: the reorder's copy of a hypothesis's
// cache rows is written once and read from memory at the next step, after the other layers have run through the
// caches; a plain store first reads each line it writes (a third of a beam-4 step's memory traffic)
template <typename T>
inline __attribute__((always_inline)) void stream_copy(const T* src, T* dst, int64_t n) {
#if defined(__SSE2__)
  if (reinterpret_cast<std::uintptr_t>(dst) % 16 == 0 && (n * sizeof(T)) % 16 == 0) {
    for (int64_t i = 0; i < n; i += 16 / sizeof(T)) {
      __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), x);
    }
    return;
  }
#endif
  std::copy(src, src + n, dst);
}

// the streamed stores above made visible to the threads that read them next
inline void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

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
    for (int64_t s = 0; s < t; ++s) stream_copy(K + s * ks, Kout + s * kos, d);
  for (int64_t m = 0; m < R * M; ++m) past[m] = T(0);
  for (int64_t s = 0; s < t; ++s) {
    const T c = C ? C[s * cs] : T(1);
    const T* __restrict__ w = W + s * ws;
    if (Wout && Wout != W) stream_copy(w, Wout + s * wos, M);
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
  // traced (StepArgs): position s of hypothesis b is in row lineage[order[b], s] of the caches (lineage [B', t]; null:
  // row order[b]), each hypothesis appends in its own row b, and lineage_out [B, t + 1] gets the rows of its positions
  bool traced;
  const int64_t* lineage;
  int64_t* lineage_out;
};

// the cache row that holds position s of hypothesis b in a traced step
template <typename T>
inline __attribute__((always_inline)) int64_t traced_row(const Step<T>& a, int64_t b, int64_t s) {
  const int64_t parent = a.order ? a.order[b] : b;
  return a.lineage ? a.lineage[parent * a.t + s] : parent;
}

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


inline Cache strides(const torch::Tensor& x) { return x.defined() ? Cache{x.stride(0), x.stride(1), x.stride(2)} : Cache{0, 0, 0}; }

// out [B, H, positions, width] of the cache's dtype, its last dim contiguous, written in place (a view of a spare
// storage, or of the cache's own when nothing is reordered)
inline void check_out(const c10::optional<torch::Tensor>& out, const torch::Tensor& cache, int64_t B, int64_t positions,
               const char* fn, const char* name) {
  TORCH_CHECK(out->dim() == 4 && out->size(0) == B && out->size(1) == cache.size(1) && out->size(2) == positions &&
                  out->size(3) == cache.size(3) && out->stride(3) == 1 && out->scalar_type() == cache.scalar_type(),
              fn, ": ", name, " must be [B, H, ", positions, ", width] like the cache, its last dim contiguous");
}

// What both steps take from their arguments, checked: the caches (keys [B', H, t, C], writes [B', H, t, M]), the
// values v [B, H, 1, D] (their shape), beta, the decay, the reorder and the outs (with `append`, of t + 1 positions).
// Traced (raw_step.cpp): the outs are the caches' own storages (views of t + 1 positions of all their rows) and the
// reorder and the lineage [B'', t] (B'' the previous step's hypotheses; absent: each its own row) say where each
// hypothesis's positions are, so that a reorder copies nothing: lineage_out [B, t + 1] says it for the next step.
struct StepArgs {
  torch::Tensor kv, wv, cv, oc, bc, ko, wo, lc, lo;  // ko, wo: keys_out and writes_out (undefined: none); lc, lo: lineage
  int64_t B, H, t, C, M;
  torch::ScalarType type;
  bool outs, traced;

  StepArgs(const torch::Tensor& keys, const torch::Tensor& writes, const torch::Tensor& v,
           const c10::optional<torch::Tensor>& beta, const c10::optional<torch::Tensor>& decay,
           const c10::optional<torch::Tensor>& order, const c10::optional<torch::Tensor>& keys_out,
           const c10::optional<torch::Tensor>& writes_out, bool append, int64_t D, const char* fn,
           const c10::optional<torch::Tensor>& lineage = c10::nullopt) {
    TORCH_CHECK(keys.dim() == 4 && writes.dim() == 4 && keys.device().is_cpu(), fn,
                ": keys and writes must be [B, H, t, d] and [B, H, t, M] CPU tensors");
    outs = keys_out.has_value();
    traced = outs && append && (order || lineage) && keys_out->data_ptr() == keys.data_ptr();
    const int64_t parents = lineage ? lineage->size(0) : keys.size(0);  // the rows `order` picks from
    B = order ? order->numel() : parents;
    H = keys.size(1);
    t = keys.size(2);
    C = keys.size(3);
    M = writes.size(3);
    type = keys.scalar_type();
    TORCH_CHECK(type == torch::kFloat || type == torch::kDouble, fn, ": keys must be float32 or float64");
    TORCH_CHECK(writes.size(0) == keys.size(0) && writes.size(1) == H && writes.size(2) == t &&
                    writes.scalar_type() == type,
                fn, ": writes must be [B, H, t, M] of the keys' dtype");
    TORCH_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == H && v.size(2) == 1 && v.size(3) == D, fn,
                ": v must be [B, H, 1, ", D, "]");
    bc = beta ? beta->to(type).contiguous() : torch::Tensor();
    TORCH_CHECK(!beta || bc.numel() == B * H, fn, ": beta must be [B, H, 1]");
    kv = last_contiguous(keys);
    wv = last_contiguous(writes);
    cv = decay ? decay->to(type) : torch::Tensor();
    TORCH_CHECK(!decay || (cv.dim() == 3 && cv.size(0) == B && cv.size(1) == H && cv.size(2) == t), fn,
                ": decay must be [B, H, t]");
    oc = order ? checked_order(*order, B, parents, fn) : torch::Tensor();
    TORCH_CHECK(outs == writes_out.has_value() && (outs || !order) && (outs || !append), fn,
                ": a reorder or an append takes both keys_out and writes_out");
    if (outs) {
      // traced: every row of the storages (each hypothesis appends in its own, B <= B')
      TORCH_CHECK(!traced || (B <= keys.size(0) && writes_out->data_ptr() == writes.data_ptr()), fn,
                  ": a traced step appends in place, in rows 0..B-1 of both caches");
      check_out(keys_out, keys, traced ? keys.size(0) : B, append ? t + 1 : t, fn, "keys_out");
      check_out(writes_out, writes, traced ? keys.size(0) : B, append ? t + 1 : t, fn, "writes_out");
      ko = *keys_out;
      wo = *writes_out;
    }
    if (lineage) {
      TORCH_CHECK(lineage->dim() == 2 && lineage->size(1) == t && lineage->scalar_type() == torch::kLong, fn,
                  ": lineage must be [B', t] int64");
      lc = lineage->contiguous();
      const int64_t* rows = lc.data_ptr<int64_t>();
      for (int64_t i = 0; i < lc.numel(); ++i)  // rows the kernel reads: checked as order's are
        TORCH_CHECK(rows[i] >= 0 && rows[i] < keys.size(0), fn, ": lineage holds ", rows[i], ", not a cache row");
    }
    if (traced) lo = torch::empty({B, t + 1}, keys.options().dtype(torch::kLong));
  }

  // the Step over these tensors, with the rows Q, Kq, V [B H, .], the appended keys (or null), O and U
  template <typename T>
  Step<T> step(const T* Q, const T* Kq, const T* V, const T* key, T* O, T* U, int64_t norm, double eps,
               int64_t nu) const {
    return Step<T>{Q, Kq, V, bc.defined() ? bc.data_ptr<T>() : nullptr, kv.data_ptr<T>(),
                   wv.data_ptr<T>(), cv.defined() ? cv.data_ptr<T>() : nullptr,
                   outs ? ko.data_ptr<T>() : nullptr, outs ? wo.data_ptr<T>() : nullptr, O, U, strides(kv),
                   strides(wv), strides(cv), strides(ko), strides(wo), oc.defined() ? oc.data_ptr<int64_t>() : nullptr,
                   key, norm, static_cast<T>(eps), H, t, C, nu, M, traced,
                   lc.defined() ? lc.data_ptr<int64_t>() : nullptr, lo.defined() ? lo.data_ptr<int64_t>() : nullptr};
  }
};


}  // namespace fw
