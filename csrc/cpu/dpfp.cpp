// DPFP-nu on the CPU, forward and backward, one pass over each row (fw_fairseq/ops/dpfp_function.py).
//
// r = [relu(x), relu(-x)] (w = 2d wide); phi_i[j] = r[j] r[(j - i) mod w], i = 1..nu, phi = [phi_1 .. phi_nu].
// Backward: dr[j] = sum_i g_i[j] r[j - i] + g_i[j + i] r[j + i] (indices mod w);
//           dx[k] = dr[k] if x[k] > 0, -dr[k + d] if x[k] < 0, else 0 (relu's gradient at 0, as autograd's).
//           With a norm (normalised phi, --fw-delta-norm), the normalisation's backward runs first on the row.
// The PyTorch form of the same maths walks [rows, w nu] tensors several times; here a row's r and dr
// live in a w-long buffer, and each modular shift is split into two plain ranges the compiler vectorises.
// Inputs: x [..., d] (any layout: made contiguous), float32 or float64; grad [..., w nu].
//
// Scores (decoding's lazy cache, fw_fairseq/decoding/decoder_state.py): S[n, q, s] = rows[n, q] . phi(keys[n, s])
// from the raw d-wide keys, phi formed a key at a time in an L1 buffer and never written out: the cache
// then holds t (d + M) values per head instead of t (2 d nu + M), as few as softmax's t 2d.
#include "kernels.h"
#include "dot.h"
#include "dpfp_rows.h"
#include "map_rows.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace {

using fw::kL2;
using fw::kNone;
using fw::kSum;
using fw::scores_rows;

constexpr int64_t kGrain = 64;  // rows per parallel task


template <typename T>
inline __attribute__((always_inline)) void scores_head(const T* Q, const T* K, T* S, int64_t R, int64_t t,
                                                       int64_t ks, int64_t d, int64_t nu) {
  std::vector<T> r_ext(fw::scores_scratch(d, nu));
  const int64_t E = 2 * d * nu;
  int64_t q = 0;
  for (; q + 2 <= R; q += 2) {
    const T* pair[2] = {Q + q * E, Q + (q + 1) * E};
    scores_rows<T, 2>(pair, K, S + q * t, t, ks, d, nu, r_ext.data());
  }
  if (q < R) {
    const T* last[1] = {Q + q * E};
    scores_rows<T, 1>(last, K, S + q * t, t, ks, d, nu, r_ext.data());
  }
}

// One clone set per dtype, overloaded so that AT_DISPATCH's scalar_t picks it.
FW_CLONES void forward_range(const float* X, float* P, int64_t d, int64_t nu, int64_t norm, double eps, int64_t b,
                             int64_t e) {
  fw::DpfpRow<float> map(d, nu);
  fw::forward_rows(map, X, P, norm, eps, b, e);
}
FW_CLONES void forward_range(const double* X, double* P, int64_t d, int64_t nu, int64_t norm, double eps, int64_t b,
                             int64_t e) {
  fw::DpfpRow<double> map(d, nu);
  fw::forward_rows(map, X, P, norm, eps, b, e);
}
FW_CLONES void backward_range(const float* G, const float* X, float* DX, int64_t d, int64_t nu, int64_t norm,
                              double eps, int64_t b, int64_t e) {
  fw::DpfpRow<float> map(d, nu);
  fw::backward_rows(map, G, X, DX, norm, eps, b, e);
}
FW_CLONES void backward_range(const double* G, const double* X, double* DX, int64_t d, int64_t nu, int64_t norm,
                              double eps, int64_t b, int64_t e) {
  fw::DpfpRow<double> map(d, nu);
  fw::backward_rows(map, G, X, DX, norm, eps, b, e);
}

FW_CLONES void scores_range(const float* Q, const float* K, float* S, int64_t H, int64_t R, int64_t t,
                            int64_t kb, int64_t kh, int64_t ks, int64_t d, int64_t nu, int64_t b, int64_t e) {
  for (int64_t n = b; n < e; ++n)
    scores_head(Q + n * R * 2 * d * nu, K + (n / H) * kb + (n % H) * kh, S + n * R * t, R, t, ks, d, nu);
}
FW_CLONES void scores_range(const double* Q, const double* K, double* S, int64_t H, int64_t R, int64_t t,
                            int64_t kb, int64_t kh, int64_t ks, int64_t d, int64_t nu, int64_t b, int64_t e) {
  for (int64_t n = b; n < e; ++n)
    scores_head(Q + n * R * 2 * d * nu, K + (n / H) * kb + (n % H) * kh, S + n * R * t, R, t, ks, d, nu);
}

void check(const torch::Tensor& x, int64_t nu, const char* fn) {
  TORCH_CHECK(x.device().is_cpu(), fn, ": x must be a CPU tensor");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kDouble, fn,
              ": x must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1, fn, ": x must be [..., d] with d >= 1");
  TORCH_CHECK(nu >= 1 && nu <= 2 * x.size(-1) - 1, fn, ": nu must be in 1..2d-1, got ", nu);
}

}  // namespace

torch::Tensor dpfp_forward(const torch::Tensor& x, int64_t nu, int64_t norm, double eps) {
  check(x, nu, "dpfp_forward");
  TORCH_CHECK(norm == kNone || norm == kSum || norm == kL2, "dpfp_forward: norm must be 0 (none), 1 (sum) or 2 (l2)");
  const auto xc = x.contiguous();
  const int64_t d = xc.size(-1), rows = xc.numel() / d;
  auto sizes = xc.sizes().vec();
  sizes.back() = 2 * d * nu;
  auto phi = torch::empty(sizes, xc.options());  // [..., 2 d nu]
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "dpfp_forward", [&] {
    const scalar_t* X = xc.data_ptr<scalar_t>();
    scalar_t* P = phi.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kGrain, [&](int64_t b, int64_t e) { forward_range(X, P, d, nu, norm, eps, b, e); });
  });
  return phi;
}

torch::Tensor dpfp_backward(const torch::Tensor& grad, const torch::Tensor& x, int64_t nu, int64_t norm, double eps) {
  check(x, nu, "dpfp_backward");
  TORCH_CHECK(norm == kNone || norm == kSum || norm == kL2, "dpfp_backward: norm must be 0 (none), 1 (sum) or 2 (l2)");
  const auto xc = x.contiguous();
  const int64_t d = xc.size(-1), rows = xc.numel() / d;
  TORCH_CHECK(grad.numel() == rows * 2 * d * nu && grad.size(-1) == 2 * d * nu,
              "dpfp_backward: grad must be [..., 2 d nu]");
  const auto gc = grad.to(xc.scalar_type()).contiguous();
  auto dx = torch::empty_like(xc);  // [..., d]
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "dpfp_backward", [&] {
    const scalar_t* X = xc.data_ptr<scalar_t>();
    const scalar_t* G = gc.data_ptr<scalar_t>();
    scalar_t* DX = dx.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kGrain, [&](int64_t b, int64_t e) { backward_range(G, X, DX, d, nu, norm, eps, b, e); });
  });
  return dx;
}

// rows [B, H, R, 2 d nu] . phi(keys [B, H, t, d]) -> [B, H, R, t]. keys keep their layout (a cache's view
// of its first t positions) as long as d is contiguous: copying them would cost what the cache saves.
torch::Tensor dpfp_scores(const torch::Tensor& rows, const torch::Tensor& keys, int64_t nu) {
  check(keys, nu, "dpfp_scores");
  TORCH_CHECK(keys.dim() == 4 && rows.dim() == 4, "dpfp_scores: rows and keys must be [B, H, R, E] and [B, H, t, d]");
  const int64_t B = keys.size(0), H = keys.size(1), t = keys.size(2), d = keys.size(3), R = rows.size(2);
  TORCH_CHECK(rows.size(0) == B && rows.size(1) == H && rows.size(3) == 2 * d * nu,
              "dpfp_scores: rows must be [B, H, R, 2 d nu] for keys [B, H, t, d]");
  TORCH_CHECK(rows.scalar_type() == keys.scalar_type(), "dpfp_scores: rows and keys must share a dtype");
  const auto kc = last_contiguous(keys);
  const auto qc = rows.contiguous();
  auto out = torch::empty({B, H, R, t}, qc.options());
  AT_DISPATCH_FLOATING_TYPES(kc.scalar_type(), "dpfp_scores", [&] {
    const scalar_t* Q = qc.data_ptr<scalar_t>();
    const scalar_t* K = kc.data_ptr<scalar_t>();
    scalar_t* S = out.data_ptr<scalar_t>();
    const int64_t kb = kc.stride(0), kh = kc.stride(1), ks = kc.stride(2);
    at::parallel_for(0, B * H, 8, [&](int64_t b, int64_t e) { scores_range(Q, K, S, H, R, t, kb, kh, ks, d, nu, b, e); });
  });
  return out;
}
