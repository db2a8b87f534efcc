// Python binding of fw_fairseq._cuda: input checks, output allocation and the order of the kernel
// passes. No autograd here (fw_fairseq/ops/cuda_functions.py wraps these).
//
// Inputs: contiguous CUDA tensors on one device; q, k [B, H, T, E], v [B, H, T, M], beta and alpha
// [B, H, T] and do [B, H, T, M] in one dtype (float16, bfloat16, float32 or float64); states
// [B, H, E, M] in float32, or float64 for float64 inputs. 1 <= E <= kMaxE, 1 <= M <= kMaxM (col_mode.h,
// exported as MAX_E and MAX_M), T >= 1.
// Results: outputs o and states in the state dtype, as fw_fairseq/ops/guards.py's state_dtype rules
// for the chunked path (the sum rule's outputs grow like t E and overflow fp16); gradients of q, k,
// v and beta in the input dtype. The column kernel writes its outputs in the state dtype, so the
// gradients it produces are narrowed here (a copy for fp16/bf16 only).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>

#include "fast_weight.h"

namespace fw {
namespace {

// fw_fairseq/ops/guards.py's state_dtype for the kernels' dtypes; also at::opmath_type, the kernels' acc_t.
at::ScalarType state_dtype(at::ScalarType input) {
  return input == at::kDouble ? at::kDouble : at::kFloat;
}

void check_tensor(const char* fn, const char* name, const at::Tensor& x, const at::Tensor& q,
                  at::ScalarType dtype, at::IntArrayRef shape) {
  TORCH_CHECK(x.is_cuda(), fn, ": ", name, " must be a CUDA tensor, got ", x.device());
  TORCH_CHECK(x.device() == q.device(), fn, ": ", name, " is on ", x.device(), " but q is on ", q.device());
  TORCH_CHECK(x.scalar_type() == dtype, fn, ": ", name, " has dtype ", x.scalar_type(), ", expected ", dtype);
  TORCH_CHECK(x.sizes() == shape, fn, ": ", name, " has shape ", dims(x.sizes()), ", expected ", dims(shape));
  TORCH_CHECK(x.is_contiguous(), fn, ": ", name, " must be contiguous");
}

// Checks every input against q's shape [B, H, T, E] and v's width M; returns nothing, throws on misuse.
void check_inputs(const char* fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const at::Tensor* beta, const at::Tensor& state, const at::Tensor* dout,
                  const at::Tensor* dfinal, bool single_step, const at::Tensor* alpha = nullptr) {
  TORCH_CHECK(q.dim() == 4, fn, ": q must be [B, H, T, E], got shape ", dims(q.sizes()));
  TORCH_CHECK(v.dim() == 4, fn, ": v must be [B, H, T, M], got shape ", dims(v.sizes()));
  const auto dtype = q.scalar_type();
  TORCH_CHECK(dtype == at::kHalf || dtype == at::kBFloat16 || dtype == at::kFloat || dtype == at::kDouble,
              fn, ": q has dtype ", dtype, "; allowed: float16, bfloat16, float32, float64");
  const int64_t B = q.size(0), H = q.size(1), T = q.size(2), E = q.size(3), M = v.size(3);
  TORCH_CHECK(single_step ? T == 1 : T >= 1, fn, ": q has T = ", num(T), single_step ? ", expected 1" : ", expected >= 1");
  TORCH_CHECK(E >= 1 && E <= kMaxE, fn, ": E = ", num(E), " is outside the kernel's 1..", num(kMaxE));
  TORCH_CHECK(M >= 1 && M <= kMaxM, fn, ": M = ", num(M), " is outside the kernel's 1..", num(kMaxM));
  check_tensor(fn, "q", q, q, dtype, {B, H, T, E});
  check_tensor(fn, "k", k, q, dtype, {B, H, T, E});
  check_tensor(fn, "v", v, q, dtype, {B, H, T, M});
  if (beta) check_tensor(fn, "beta", *beta, q, dtype, {B, H, T});
  if (alpha) check_tensor(fn, "alpha", *alpha, q, dtype, {B, H, T});
  check_tensor(fn, "state", state, q, state_dtype(dtype), {B, H, E, M});
  if (dout) check_tensor(fn, "do", *dout, q, dtype, {B, H, T, M});
  if (dfinal) check_tensor(fn, "dstate_final", *dfinal, q, state_dtype(dtype), {B, H, E, M});
}

at::Tensor seq_buffer(const at::Tensor& like, int64_t width, at::ScalarType dtype) {
  return at::empty({like.size(0), like.size(1), like.size(2), width}, like.options().dtype(dtype));
}

std::tuple<at::Tensor, at::Tensor> sum_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                               const at::Tensor& state) {
  check_inputs("sum_forward", q, k, v, nullptr, state, nullptr, nullptr, false);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());
  auto final_state = at::empty_like(state);
  launch_col(ColMode::kSum, q, k, v, {}, {}, state, final_state, o, {}, false);
  return {o, final_state};
}

// Three sum-rule recurrences with the roles of q, k, v permuted (no state is ever rebuilt):
//   dq_t = W_t do_t:   W_t^T = W_0^T + sum_{s<=t} v_s k_s^T           (forward, state [M, E])
//   dk_t = G_t v_t:    G_t^T = dS^T + sum_{s>=t} do_s q_s^T           (reverse, state [M, E])
//   dv_t = G_t^T k_t:  G_t = dS + sum_{s>=t} q_s do_s^T, G_1 = dstate0 (reverse, state [E, M])
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> sum_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& state0,
    const at::Tensor& dout, const at::Tensor& dfinal) {
  check_inputs("sum_backward", q, k, v, nullptr, state0, &dout, &dfinal, false);
  const c10::cuda::CUDAGuard guard(q.device());
  const auto acc = state0.scalar_type();
  auto dq = seq_buffer(q, q.size(3), acc), dk = seq_buffer(k, k.size(3), acc), dv = seq_buffer(v, v.size(3), acc);
  auto dstate0 = at::empty_like(state0);
  launch_col(ColMode::kSum, dout, v, k, {}, {}, state0.transpose(-1, -2).contiguous(), {}, dq, {}, false);
  launch_col(ColMode::kSum, v, dout, q, {}, {}, dfinal.transpose(-1, -2).contiguous(), {}, dk, {}, true);
  launch_col(ColMode::kSum, k, q, dout, {}, {}, dfinal, dstate0, dv, {}, true);
  const auto dtype = q.scalar_type();
  return {dq.to(dtype), dk.to(dtype), dv.to(dtype), dstate0};
}

std::tuple<at::Tensor, at::Tensor> delta_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                 const at::Tensor& beta, const at::Tensor& state) {
  check_inputs("delta_forward", q, k, v, &beta, state, nullptr, nullptr, false);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());
  auto final_state = at::empty_like(state);
  launch_col(ColMode::kDelta, q, k, v, beta, {}, state, final_state, o, {}, false);
  return {o, final_state};
}

// Four passes, extra memory O(T (E + M)) in acc_t:
//   1. columns, forward: recompute vbar_t = W_{t-1}^T k_t                       [B, H, T, M]
//   2. columns, reverse: G = dL/dW_t, du_t = G_t^T k_t, dv_t = beta_t du_t, dstate0 [B, H, T, M]
//   3. rows, forward:    dq_t = W_t do_t, dbeta_t, and -beta_t W_{t-1} du_t        [B, H, T, E]
//   4. rows, reverse:    dk_t = G_t u_t - beta_t W_{t-1} du_t
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> delta_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
    const at::Tensor& state0, const at::Tensor& dout, const at::Tensor& dfinal) {
  check_inputs("delta_backward", q, k, v, &beta, state0, &dout, &dfinal, false);
  const c10::cuda::CUDAGuard guard(q.device());
  const auto acc = state0.scalar_type();
  auto vbar = seq_buffer(v, v.size(3), acc), du = seq_buffer(v, v.size(3), acc);
  auto dk_part = seq_buffer(q, q.size(3), acc);
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = seq_buffer(v, v.size(3), acc);
  auto dbeta = at::empty_like(beta), dstate0 = at::empty_like(state0);
  launch_col(ColMode::kDelta, q, k, v, beta, {}, state0, {}, {}, vbar, false);
  launch_col(ColMode::kDeltaGrad, q, k, dout, beta, {}, dfinal, dstate0, dv, du, true);
  launch_delta_grad_rows(q, k, v, beta, {}, dout, vbar, du, state0, dfinal, dq, dk, dbeta, dk_part);
  return {dq, dk, dv.to(q.scalar_type()), dbeta, dstate0};
}

std::tuple<at::Tensor, at::Tensor> gated_delta_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                       const at::Tensor& beta, const at::Tensor& alpha,
                                                       const at::Tensor& state) {
  check_inputs("gated_delta_forward", q, k, v, &beta, state, nullptr, nullptr, false, &alpha);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());
  auto final_state = at::empty_like(state);
  launch_col(ColMode::kGatedDelta, q, k, v, beta, alpha, state, final_state, o, {}, false);
  return {o, final_state};
}

// delta_backward's four passes with the gate in every recurrence (vbar_t = alpha_t W_{t-1}^T k_t,
// G_{t-1} = alpha_t (G_t - beta_t k_t du_t^T) + q_{t-1} do_{t-1}^T), plus the gate's gradient, which
// needs no pass of its own (cuda/README.md): with dv_t = beta_t du_t,
//   alpha_t dL/dalpha_t = sum_{s>=t} (o_s . do_s - dv_s . v_s) + <dS_T, S_T>,
// a reverse cumulative sum of per-position dot products; pass 1 also writes o and S_T for it.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> gated_delta_backward(
    const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta, const at::Tensor& alpha,
    const at::Tensor& state0, const at::Tensor& dout, const at::Tensor& dfinal) {
  check_inputs("gated_delta_backward", q, k, v, &beta, state0, &dout, &dfinal, false, &alpha);
  const c10::cuda::CUDAGuard guard(q.device());
  const auto acc = state0.scalar_type();
  auto o = seq_buffer(v, v.size(3), acc), vbar = seq_buffer(v, v.size(3), acc), du = seq_buffer(v, v.size(3), acc);
  auto final_state = at::empty_like(state0), dk_part = seq_buffer(q, q.size(3), acc);
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = seq_buffer(v, v.size(3), acc);
  auto dbeta = at::empty_like(beta), dstate0 = at::empty_like(state0);
  launch_col(ColMode::kGatedDelta, q, k, v, beta, alpha, state0, final_state, o, vbar, false);
  launch_col(ColMode::kGatedDeltaGrad, q, k, dout, beta, alpha, dfinal, dstate0, dv, du, true);
  launch_delta_grad_rows(q, k, v, beta, alpha, dout, vbar, du, state0, dfinal, dq, dk, dbeta, dk_part);
  const auto per_position = (o * dout.to(acc)).sum(-1) - (dv * v.to(acc)).sum(-1);  // [B, H, T]
  const auto carried = (dfinal * final_state).sum({-2, -1}).unsqueeze(-1);  // <dS_T, S_T>, [B, H, 1]
  const auto dlog_alpha = per_position.flip(-1).cumsum(-1).flip(-1) + carried;
  const auto dalpha = (dlog_alpha / alpha.to(acc)).to(q.scalar_type());
  return {dq, dk, dv.to(q.scalar_type()), dbeta, dalpha, dstate0};
}

at::Tensor sum_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& state) {
  check_inputs("sum_step", q, k, v, nullptr, state, nullptr, nullptr, true);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());
  launch_step(false, q, k, v, {}, {}, state, o);
  return o;
}

at::Tensor delta_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                      const at::Tensor& state) {
  check_inputs("delta_step", q, k, v, &beta, state, nullptr, nullptr, true);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());
  launch_step(true, q, k, v, beta, {}, state, o);
  return o;
}

at::Tensor gated_delta_step(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& beta,
                            const at::Tensor& alpha, const at::Tensor& state) {
  check_inputs("gated_delta_step", q, k, v, &beta, state, nullptr, nullptr, true, &alpha);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());
  launch_step(true, q, k, v, beta, alpha, state, o);
  return o;
}

}  // namespace
}  // namespace fw

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Causal fast weight (sum, delta and gated delta rule) CUDA kernels; see cuda/README.md";
  m.attr("MAX_E") = fw::kMaxE;
  m.attr("MAX_M") = fw::kMaxM;
  m.def("sum_forward", &fw::sum_forward, "(q, k, v, state0) -> (o, final_state)");
  m.def("sum_backward", &fw::sum_backward, "(q, k, v, state0, do, dstate_final) -> (dq, dk, dv, dstate0)");
  m.def("delta_forward", &fw::delta_forward, "(q, k, v, beta, state0) -> (o, final_state)");
  m.def("delta_backward", &fw::delta_backward,
        "(q, k, v, beta, state0, do, dstate_final) -> (dq, dk, dv, dbeta, dstate0)");
  m.def("gated_delta_forward", &fw::gated_delta_forward, "(q, k, v, beta, alpha, state0) -> (o, final_state)");
  m.def("gated_delta_backward", &fw::gated_delta_backward,
        "(q, k, v, beta, alpha, state0, do, dstate_final) -> (dq, dk, dv, dbeta, dalpha, dstate0)");
  m.def("sum_step", &fw::sum_step, "(q, k, v, state) -> o; T = 1, updates state in place");
  m.def("delta_step", &fw::delta_step, "(q, k, v, beta, state) -> o; T = 1, updates state in place");
  m.def("gated_delta_step", &fw::gated_delta_step, "(q, k, v, beta, alpha, state) -> o; T = 1, updates state in place");
}
