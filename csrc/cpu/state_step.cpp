// A decoding step of the fast weight state on the CPU, with beam search's reorder folded in
// (the rules' in_place_step, fw_fairseq/ops/rules/*/step.py; the same function as its PyTorch form).
//
// Per hypothesis b and head h, with S = state[order[b], h] ([E, M]; order absent: b itself):
//   S' = alpha S (alpha absent: S)
//   u  = beta (v - k S')  (delta rules)   or   u = v  (sum rule: beta absent)
//   o  = q S' + (q . k) u                  out[b, h] = S' + k^T u
// fairseq reorders the hypotheses before every step; done apart, the reorder copies each [E, M] state and
// the step then reads it twice and writes it once. Here a head's state is read from memory once (the
// second pass finds its 64 KB in cache) and written once, into `out` (`state` itself when order is absent).
#include "kernels.h"
#include "dot.h"

#include <ATen/Parallel.h>

#include <vector>

namespace {

template <typename T>
inline __attribute__((always_inline)) void step_head(const T* __restrict__ S, T* D, const T* __restrict__ q,
                                                     const T* __restrict__ k, const T* __restrict__ v, const T* beta,
                                                     const T* alpha, T* __restrict__ o, int64_t E, int64_t M,
                                                     T* __restrict__ rq, T* __restrict__ rk) {
  const T a = alpha ? *alpha : T(1);
  for (int64_t m = 0; m < M; ++m) rq[m] = rk[m] = T(0);
  // pass 1: q S and k S, a row of S at a time (vectorised over M)
  for (int64_t e = 0; e < E; ++e) {
    const T* __restrict__ row = S + e * M;
    const T qe = q[e], ke = k[e];
    if (beta) {
      for (int64_t m = 0; m < M; ++m) {
        rq[m] += qe * row[m];
        rk[m] += ke * row[m];
      }
    } else {
      for (int64_t m = 0; m < M; ++m) rq[m] += qe * row[m];
    }
  }
  const T qk = fw::dot(q, k, E);
  // u in rk's place: beta (v - alpha k S) or v
  for (int64_t m = 0; m < M; ++m) rk[m] = beta ? *beta * (v[m] - a * rk[m]) : v[m];
  for (int64_t m = 0; m < M; ++m) o[m] = a * rq[m] + qk * rk[m];
  // pass 2: S' + k^T u (D may be S: each entry is read before it is written)
  for (int64_t e = 0; e < E; ++e) {
    const T* row = S + e * M;
    T* out_row = D + e * M;
    const T ke = k[e];
    for (int64_t m = 0; m < M; ++m) out_row[m] = a * row[m] + ke * rk[m];
  }
}

template <typename T>
inline __attribute__((always_inline)) void step_rows(const T* S, T* D, const T* Q, const T* K, const T* V,
                                                     const T* beta, const T* alpha, const int64_t* order, T* O,
                                                     int64_t H, int64_t E, int64_t M, int64_t b, int64_t e) {
  std::vector<T> rq(M), rk(M);
  for (int64_t n = b; n < e; ++n) {
    const int64_t source = order ? order[n / H] * H + n % H : n;
    step_head(S + source * E * M, D + n * E * M, Q + n * E, K + n * E, V + n * M, beta ? beta + n : nullptr,
              alpha ? alpha + n : nullptr, O + n * M, E, M, rq.data(), rk.data());
  }
}

FW_CLONES void step_range(const float* S, float* D, const float* Q, const float* K, const float* V, const float* beta,
                          const float* alpha, const int64_t* order, float* O, int64_t H, int64_t E, int64_t M,
                          int64_t b, int64_t e) {
  step_rows(S, D, Q, K, V, beta, alpha, order, O, H, E, M, b, e);
}
FW_CLONES void step_range(const double* S, double* D, const double* Q, const double* K, const double* V,
                          const double* beta, const double* alpha, const int64_t* order, double* O, int64_t H,
                          int64_t E, int64_t M, int64_t b, int64_t e) {
  step_rows(S, D, Q, K, V, beta, alpha, order, O, H, E, M, b, e);
}

// x as a contiguous [B, H, 1, width] tensor of the state's dtype
torch::Tensor rows_of(const torch::Tensor& x, const torch::Tensor& state, int64_t B, int64_t H, int64_t width,
                      const char* name) {
  TORCH_CHECK(x.numel() == B * H * width, "state_step: ", name, " must hold B H ", width, " values");
  return x.to(state.scalar_type()).contiguous();
}

}  // namespace

// q, k [B, H, 1, E]; v [B, H, 1, M]; beta, alpha [B, H, 1] or None; state [B', H, E, M] (contiguous);
// order [B] (int64 rows of state) or None (B' = B); out [B, H, E, M] (contiguous; `state` when order is None).
torch::Tensor state_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const c10::optional<torch::Tensor>& beta, const c10::optional<torch::Tensor>& alpha,
                         const torch::Tensor& state, const c10::optional<torch::Tensor>& order, torch::Tensor out) {
  TORCH_CHECK(state.device().is_cpu() && state.dim() == 4 && state.is_contiguous(),
              "state_step: state must be a contiguous [B', H, E, M] CPU tensor");
  TORCH_CHECK(state.scalar_type() == torch::kFloat || state.scalar_type() == torch::kDouble,
              "state_step: state must be float32 or float64");
  const int64_t B = q.size(0), H = state.size(1), E = state.size(2), M = state.size(3);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == state.scalar_type() &&
                  out.sizes() == torch::IntArrayRef({B, H, E, M}),
              "state_step: out must be a contiguous [B, H, E, M] tensor of the state's dtype");
  if (order) {
    TORCH_CHECK(out.data_ptr() != state.data_ptr(), "state_step: a reordering step needs out apart from state");
  } else {
    TORCH_CHECK(state.size(0) == B, "state_step: without order, state must have B rows");
  }
  const auto qc = rows_of(q, state, B, H, E, "q"), kc = rows_of(k, state, B, H, E, "k");
  const auto vc = rows_of(v, state, B, H, M, "v");
  const auto bc = beta ? rows_of(*beta, state, B, H, 1, "beta") : torch::Tensor();
  const auto ac = alpha ? rows_of(*alpha, state, B, H, 1, "alpha") : torch::Tensor();
  const auto oc = order ? checked_order(*order, B, state.size(0), "state_step") : torch::Tensor();
  auto o = torch::empty({B, H, 1, M}, state.options());
  AT_DISPATCH_FLOATING_TYPES(state.scalar_type(), "state_step", [&] {
    const scalar_t* S = state.data_ptr<scalar_t>();
    scalar_t* D = out.data_ptr<scalar_t>();
    const scalar_t* betas = beta ? bc.data_ptr<scalar_t>() : nullptr;
    const scalar_t* alphas = alpha ? ac.data_ptr<scalar_t>() : nullptr;
    const int64_t* rows = order ? oc.data_ptr<int64_t>() : nullptr;
    at::parallel_for(0, B * H, 4, [&](int64_t b, int64_t e) {
      step_range(S, D, qc.data_ptr<scalar_t>(), kc.data_ptr<scalar_t>(), vc.data_ptr<scalar_t>(), betas, alphas, rows,
                 o.data_ptr<scalar_t>(), H, E, M, b, e);
    });
  });
  return o;
}
