// A decoding step of the lazy cache with DPFP's raw keys (fw_fairseq/modules/decoder_state.py's lazy_step, the
// same function), in one pass over the cache and one call instead of about fifteen small ops. Per head:
//   a_s = phi(q) . phi(K_s) c_s,   b_s = phi(k) . phi(K_s) c_s        (c_s: the decay, 1 without one)
//   u = beta (v - sum_s b_s W_s)  (delta rules)   or   u = v  (sum rule: beta absent)
//   o = sum_s a_s W_s + (phi(q) . phi(k)) u
// K [t, d] the cached raw keys, W [t, M] the cached writes (already multiplied by the keys' normalisation).
#include "kernels.h"
#include "dot.h"
#include "dpfp_rows.h"

#include <ATen/Parallel.h>

#include <vector>

namespace {

template <typename T>
inline __attribute__((always_inline)) void lazy_head(const T* q, const T* k, const T* v, const T* beta, const T* K,
                                                     int64_t ks, const T* W, int64_t ws, const T* C, int64_t cs,
                                                     int64_t t, int64_t d, int64_t nu, int64_t M, T* o, T* u,
                                                     T* S, T* r_ext, T* past) {
  const int64_t E = 2 * d * nu, R = beta ? 2 : 1;
  const T* rows[2] = {q, k};
  if (beta) {
    fw::scores_rows<T, 2>(rows, K, S, t, ks, d, nu, r_ext);
  } else {
    fw::scores_rows<T, 1>(rows, K, S, t, ks, d, nu, r_ext);
  }
  T* __restrict__ read_q = past;  // sum_s a_s W_s
  T* __restrict__ read_k = past + M;  // sum_s b_s W_s
  for (int64_t m = 0; m < R * M; ++m) past[m] = T(0);
  for (int64_t s = 0; s < t; ++s) {
    const T c = C ? C[s * cs] : T(1);
    const T* __restrict__ w = W + s * ws;
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
}

struct Cache {  // a [B, H, t, width] view's base and strides (width contiguous)
  int64_t b, h, s;
};

template <typename T>
inline __attribute__((always_inline)) void lazy_rows(const T* Q, const T* Kq, const T* V, const T* beta, const T* K,
                                                     Cache kc, const T* W, Cache wc, const T* C, Cache cc, T* O, T* U,
                                                     int64_t H, int64_t t, int64_t d, int64_t nu, int64_t M,
                                                     int64_t begin, int64_t end) {
  const int64_t E = 2 * d * nu;
  std::vector<T> S(2 * t), r_ext(2 * d + nu), past(2 * M);
  for (int64_t n = begin; n < end; ++n) {
    const int64_t b = n / H, h = n % H;
    lazy_head(Q + n * E, Kq + n * E, V + n * M, beta ? beta + n : nullptr, K + b * kc.b + h * kc.h, kc.s,
              W + b * wc.b + h * wc.h, wc.s, C ? C + b * cc.b + h * cc.h : nullptr, cc.s, t, d, nu, M, O + n * M,
              U + n * M, S.data(), r_ext.data(), past.data());
  }
}

FW_CLONES void lazy_range(const float* Q, const float* Kq, const float* V, const float* beta, const float* K, Cache kc,
                          const float* W, Cache wc, const float* C, Cache cc, float* O, float* U, int64_t H, int64_t t,
                          int64_t d, int64_t nu, int64_t M, int64_t b, int64_t e) {
  lazy_rows(Q, Kq, V, beta, K, kc, W, wc, C, cc, O, U, H, t, d, nu, M, b, e);
}
FW_CLONES void lazy_range(const double* Q, const double* Kq, const double* V, const double* beta, const double* K,
                          Cache kc, const double* W, Cache wc, const double* C, Cache cc, double* O, double* U,
                          int64_t H, int64_t t, int64_t d, int64_t nu, int64_t M, int64_t b, int64_t e) {
  lazy_rows(Q, Kq, V, beta, K, kc, W, wc, C, cc, O, U, H, t, d, nu, M, b, e);
}

// the tensor as a view with its last dim contiguous (a cache's view keeps its layout: copying it would
// cost what the cache saves)
torch::Tensor last_contiguous(const torch::Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

}  // namespace

// phi_q, phi_k [B, H, 1, E]; v [B, H, 1, M]; beta [B, H, 1] or None (sum rule); keys [B, H, t, d];
// writes [B, H, t, M]; decay [B, H, t] or None -> (o, u), each [B, H, 1, M]
std::tuple<torch::Tensor, torch::Tensor> dpfp_lazy_step(const torch::Tensor& phi_q, const torch::Tensor& phi_k,
                                                        const torch::Tensor& v, const c10::optional<torch::Tensor>& beta,
                                                        const torch::Tensor& keys, const torch::Tensor& writes,
                                                        const c10::optional<torch::Tensor>& decay, int64_t nu) {
  TORCH_CHECK(keys.dim() == 4 && writes.dim() == 4 && keys.device().is_cpu(),
              "dpfp_lazy_step: keys and writes must be [B, H, t, d] and [B, H, t, M] CPU tensors");
  const int64_t B = keys.size(0), H = keys.size(1), t = keys.size(2), d = keys.size(3), M = writes.size(3);
  const int64_t E = 2 * d * nu;
  const auto type = keys.scalar_type();
  TORCH_CHECK(type == torch::kFloat || type == torch::kDouble, "dpfp_lazy_step: keys must be float32 or float64");
  TORCH_CHECK(nu >= 1 && nu <= 2 * d - 1, "dpfp_lazy_step: nu must be in 1..2d-1, got ", nu);
  TORCH_CHECK(writes.size(0) == B && writes.size(1) == H && writes.size(2) == t && writes.scalar_type() == type,
              "dpfp_lazy_step: writes must be [B, H, t, M] of the keys' dtype");
  TORCH_CHECK(phi_q.numel() == B * H * E && phi_k.numel() == B * H * E && v.numel() == B * H * M,
              "dpfp_lazy_step: phi_q, phi_k must be [B, H, 1, 2 d nu] and v [B, H, 1, M]");
  const auto qc = phi_q.to(type).contiguous(), kqc = phi_k.to(type).contiguous(), vc = v.to(type).contiguous();
  const auto bc = beta ? beta->to(type).contiguous() : torch::Tensor();
  TORCH_CHECK(!beta || bc.numel() == B * H, "dpfp_lazy_step: beta must be [B, H, 1]");
  const auto kv = last_contiguous(keys), wv = last_contiguous(writes);
  const auto cv = decay ? decay->to(type) : torch::Tensor();
  TORCH_CHECK(!decay || (cv.dim() == 3 && cv.size(0) == B && cv.size(1) == H && cv.size(2) == t),
              "dpfp_lazy_step: decay must be [B, H, t]");
  auto o = torch::empty({B, H, 1, M}, keys.options()), u = torch::empty({B, H, 1, M}, keys.options());
  AT_DISPATCH_FLOATING_TYPES(type, "dpfp_lazy_step", [&] {
    const Cache kc{kv.stride(0), kv.stride(1), kv.stride(2)}, wc{wv.stride(0), wv.stride(1), wv.stride(2)};
    const Cache cc = decay ? Cache{cv.stride(0), cv.stride(1), cv.stride(2)} : Cache{0, 0, 0};
    const scalar_t* betas = beta ? bc.data_ptr<scalar_t>() : nullptr;
    const scalar_t* C = decay ? cv.data_ptr<scalar_t>() : nullptr;
    at::parallel_for(0, B * H, 4, [&](int64_t b, int64_t e) {
      lazy_range(qc.data_ptr<scalar_t>(), kqc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), betas,
                 kv.data_ptr<scalar_t>(), kc, wv.data_ptr<scalar_t>(), wc, C, cc, o.data_ptr<scalar_t>(),
                 u.data_ptr<scalar_t>(), H, t, d, nu, M, b, e);
    });
  });
  return {o, u};
}
