// The binding of the lazy cache's decoding step over phi rows (fw_fairseq/decoding/decoder_state.py's lazy_step, the
// same function; the step per head and what it computes: lazy_head.h).
#include "lazy_head.h"

#include <ATen/Parallel.h>

namespace {

using fw::HeadCaches;
using fw::lazy_head;
using fw::Step;
using fw::StepArgs;

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
  fw::stream_fence();
}

FW_CLONES void lazy_range(const Step<float>& a, int64_t b, int64_t e) { lazy_rows(a, b, e); }
FW_CLONES void lazy_range(const Step<double>& a, int64_t b, int64_t e) { lazy_rows(a, b, e); }

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
  const auto qc = phi_q.to(a.type).contiguous(), kqc = phi_k.to(a.type).contiguous(), vc = v.to(a.type).contiguous();
  const auto nc = key ? key->to(a.type).contiguous() : torch::Tensor();
  TORCH_CHECK(!key || nc.numel() == a.B * a.H * d, "lazy_step: key must be [B, H, 1, d]");
  auto o = torch::empty({a.B, a.H, 1, a.M}, keys.options()), u = torch::empty({a.B, a.H, 1, a.M}, keys.options());
  AT_DISPATCH_FLOATING_TYPES(a.type, "lazy_step", [&] {
    const auto step = a.step<scalar_t>(qc.data_ptr<scalar_t>(), kqc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(),
                                       key ? nc.data_ptr<scalar_t>() : nullptr, o.data_ptr<scalar_t>(),
                                       u.data_ptr<scalar_t>(), norm, eps, nu);
    at::parallel_for(0, a.B * a.H, 4, [&](int64_t b, int64_t e) { lazy_range(step, b, e); });
  });
  return {o, u};
}
