// Python binding of fw_fairseq._cuda: input checks, output allocation and the order of the kernel
// passes. No autograd here (fw_fairseq/ops/kernels/cuda_functions.py wraps these).
//
// Each rule the kernels implement is bound under its name (UpdateRule.kernel: sum, delta, gated_delta) as
// three functions, all made from the one forward, backward and step below:
//   {kernel}_forward(q, k, v, *scalars, state0)                      -> (o, final_state)
//   {kernel}_backward(q, k, v, *scalars, state0, do, dstate_final)   -> (dq, dk, dv, *dscalars, dstate0)
//   {kernel}_step(q, k, v, *scalars, state) -> o                        (T = 1, state updated in place)
// where scalars are the per-position inputs the rule reads, in the ops' order: none (sum), beta (delta),
// beta and alpha (gated delta).
//
// Inputs: contiguous CUDA tensors on one device; q, k [B, H, T, E], v [B, H, T, M], beta and alpha
// [B, H, T] and do [B, H, T, M] in one dtype (float16, bfloat16, float32 or float64); states
// [B, H, E, M] in float32, or float64 for float64 inputs. 1 <= E <= kMaxE, 1 <= M <= kMaxM (col_mode.h,
// exported as MAX_E and MAX_M), T >= 1.
// Results: outputs o and states in the state dtype, as fw_fairseq/ops/common/guards.py's state_dtype rules
// for the chunked path (the sum rule's outputs grow like t E and overflow fp16); gradients of q, k,
// v, beta and alpha in the input dtype. The column kernel writes its outputs in the state dtype, so the
// gradients it produces are narrowed here (a copy for fp16/bf16 only).
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>

#include <string>
#include <utility>
#include <vector>

#include "fast_weight.h"

namespace fw {
namespace {

enum class Rule { kSum, kDelta, kGatedDelta };

// The per-position scalars' names, in the order the rules read them (a rule reads the first 0, 1 or 2).
constexpr const char* kScalarNames[] = {"beta", "alpha"};

// One call's per-position scalars [B, H, T]; a scalar the rule does not read is undefined.
struct Scalars {
  at::Tensor beta, alpha;
};

// fw_fairseq/ops/common/guards.py's state_dtype for the kernels' dtypes; also at::opmath_type, the kernels' acc_t.
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

// Checks every input against q's shape [B, H, T, E] and v's width M; an undefined scalar, dout or dfinal is
// absent and not checked. Returns nothing, throws on misuse.
void check_inputs(const std::string& name, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                  const Scalars& s, const at::Tensor& state, const at::Tensor& dout, const at::Tensor& dfinal,
                  bool single_step) {
  const char* fn = name.c_str();
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
  if (s.beta.defined()) check_tensor(fn, "beta", s.beta, q, dtype, {B, H, T});
  if (s.alpha.defined()) check_tensor(fn, "alpha", s.alpha, q, dtype, {B, H, T});
  check_tensor(fn, "state", state, q, state_dtype(dtype), {B, H, E, M});
  if (dout.defined()) check_tensor(fn, "do", dout, q, dtype, {B, H, T, M});
  if (dfinal.defined()) check_tensor(fn, "dstate_final", dfinal, q, state_dtype(dtype), {B, H, E, M});
}

// [B, H, T, width] like `like`'s first three dimensions, in dtype, uninitialised.
at::Tensor seq_buffer(const at::Tensor& like, int64_t width, at::ScalarType dtype) {
  return at::empty({like.size(0), like.size(1), like.size(2), width}, like.options().dtype(dtype));
}

ColMode forward_mode(Rule rule) {
  return rule == Rule::kSum ? ColMode::kSum : rule == Rule::kDelta ? ColMode::kDelta : ColMode::kGatedDelta;
}

std::tuple<at::Tensor, at::Tensor> forward(Rule rule, const std::string& fn, const at::Tensor& q,
                                           const at::Tensor& k, const at::Tensor& v, const Scalars& s,
                                           const at::Tensor& state) {
  check_inputs(fn, q, k, v, s, state, {}, {}, false);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());  // [B, H, T, M]
  auto final_state = at::empty_like(state);
  launch_col(forward_mode(rule), q, k, v, s.beta, s.alpha, state, final_state, o, {}, false);
  return {o, final_state};
}

// Three sum-rule recurrences with the roles of q, k, v permuted (no state is ever rebuilt):
//   dq_t = W_t do_t:   W_t^T = W_0^T + sum_{s<=t} v_s k_s^T           (forward, state [M, E])
//   dk_t = G_t v_t:    G_t^T = dS^T + sum_{s>=t} do_s q_s^T           (reverse, state [M, E])
//   dv_t = G_t^T k_t:  G_t = dS + sum_{s>=t} q_s do_s^T, G_1 = dstate0 (reverse, state [E, M])
// Returns {dq, dk, dv, dstate0}.
std::vector<at::Tensor> sum_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                     const at::Tensor& state0, const at::Tensor& dout, const at::Tensor& dfinal) {
  const auto acc = state0.scalar_type();
  auto dq = seq_buffer(q, q.size(3), acc), dk = seq_buffer(k, k.size(3), acc), dv = seq_buffer(v, v.size(3), acc);
  auto dstate0 = at::empty_like(state0);
  launch_col(ColMode::kSum, dout, v, k, {}, {}, state0.transpose(-1, -2).contiguous(), {}, dq, {}, false);
  launch_col(ColMode::kSum, v, dout, q, {}, {}, dfinal.transpose(-1, -2).contiguous(), {}, dk, {}, true);
  launch_col(ColMode::kSum, k, q, dout, {}, {}, dfinal, dstate0, dv, {}, true);
  const auto dtype = q.scalar_type();
  return {dq.to(dtype), dk.to(dtype), dv.to(dtype), dstate0};
}

// The gate's gradient needs no pass of its own (csrc/cuda/README.md): with dv_t = beta_t du_t,
//   alpha_t dL/dalpha_t = sum_{s>=t} (o_s . do_s - dv_s . v_s) + <dS_T, S_T>,
// a reverse cumulative sum of per-position dot products. o, dv [B, H, T, M] and final_state [B, H, E, M] in
// acc_t; returns dalpha [B, H, T] in the input dtype.
at::Tensor gate_grad(const at::Tensor& alpha, const at::Tensor& v, const at::Tensor& dout, const at::Tensor& o,
                     const at::Tensor& dv, const at::Tensor& final_state, const at::Tensor& dfinal) {
  const auto acc = final_state.scalar_type();
  const auto per_position = (o * dout.to(acc)).sum(-1) - (dv * v.to(acc)).sum(-1);  // [B, H, T]
  const auto carried = (dfinal * final_state).sum({-2, -1}).unsqueeze(-1);  // <dS_T, S_T>, [B, H, 1]
  const auto dlog_alpha = per_position.flip(-1).cumsum(-1).flip(-1) + carried;
  return (dlog_alpha / alpha.to(acc)).to(alpha.scalar_type());
}

// Four passes, extra memory O(T (E + M)) in acc_t; with alpha, the gate is in every recurrence
// (vbar_t = alpha_t W_{t-1}^T k_t, G_{t-1} = alpha_t (G_t - beta_t k_t du_t^T) + q_{t-1} do_{t-1}^T):
//   1. columns, forward: recompute vbar_t = W_{t-1}^T k_t                       [B, H, T, M]
//   2. columns, reverse: G = dL/dW_t, du_t = G_t^T k_t, dv_t = beta_t du_t, dstate0 [B, H, T, M]
//   3. rows, forward:    dq_t = W_t do_t, dbeta_t, and -beta_t W_{t-1} du_t        [B, H, T, E]
//   4. rows, reverse:    dk_t = G_t u_t - beta_t W_{t-1} du_t
// The gated pass 1 also writes o and the final state, which the gate's gradient reads.
// Returns {dq, dk, dv, dbeta, dstate0}, with dalpha before dstate0 for the gated rule.
std::vector<at::Tensor> delta_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const Scalars& s, const at::Tensor& state0, const at::Tensor& dout,
                                       const at::Tensor& dfinal) {
  const bool gated = s.alpha.defined();
  const auto acc = state0.scalar_type();
  auto vbar = seq_buffer(v, v.size(3), acc), du = seq_buffer(v, v.size(3), acc);
  auto dk_part = seq_buffer(q, q.size(3), acc);
  auto dq = at::empty_like(q), dk = at::empty_like(k), dv = seq_buffer(v, v.size(3), acc);
  auto dbeta = at::empty_like(s.beta), dstate0 = at::empty_like(state0);
  at::Tensor o, final_state;
  if (gated) {
    o = seq_buffer(v, v.size(3), acc);
    final_state = at::empty_like(state0);
  }
  launch_col(gated ? ColMode::kGatedDelta : ColMode::kDelta, q, k, v, s.beta, s.alpha, state0, final_state, o,
             vbar, false);
  launch_col(gated ? ColMode::kGatedDeltaGrad : ColMode::kDeltaGrad, q, k, dout, s.beta, s.alpha, dfinal, dstate0,
             dv, du, true);
  launch_delta_grad_rows(q, k, v, s.beta, s.alpha, dout, vbar, du, state0, dfinal, dq, dk, dbeta, dk_part);
  std::vector<at::Tensor> grads{dq, dk, dv.to(q.scalar_type()), dbeta};
  if (gated) grads.push_back(gate_grad(s.alpha, v, dout, o, dv, final_state, dfinal));
  grads.push_back(dstate0);
  return grads;
}

std::vector<at::Tensor> backward(Rule rule, const std::string& fn, const at::Tensor& q, const at::Tensor& k,
                                 const at::Tensor& v, const Scalars& s, const at::Tensor& state0,
                                 const at::Tensor& dout, const at::Tensor& dfinal) {
  check_inputs(fn, q, k, v, s, state0, dout, dfinal, false);
  const c10::cuda::CUDAGuard guard(q.device());
  if (rule == Rule::kSum) return sum_backward(q, k, v, state0, dout, dfinal);
  return delta_backward(q, k, v, s, state0, dout, dfinal);
}

at::Tensor step(Rule rule, const std::string& fn, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const Scalars& s, const at::Tensor& state) {
  check_inputs(fn, q, k, v, s, state, {}, {}, true);
  const c10::cuda::CUDAGuard guard(q.device());
  auto o = seq_buffer(v, v.size(3), state.scalar_type());  // [B, H, 1, M]
  launch_step(rule != Rule::kSum, q, k, v, s.beta, s.alpha, state, o);
  return o;
}

// The binding's parameter type for the per-position scalar number I.
template <size_t I>
using ScalarArg = const at::Tensor&;

// Binds rule `name` as {name}_forward, {name}_backward and {name}_step, each taking q, k, v, then the rule's
// sizeof...(I) per-position scalars positionally, as the Python side passes them; the first scalar is beta,
// the second alpha (kScalarNames).
template <size_t... I>
void bind_rule(pybind11::module_& m, Rule rule, const std::string& name, std::index_sequence<I...>) {
  std::string scalars;  // ", beta, alpha" for the docstrings
  ((scalars += std::string(", ") + kScalarNames[I]), ...);
  const std::string forward_fn = name + "_forward", backward_fn = name + "_backward", step_fn = name + "_step";
  m.def(forward_fn.c_str(),
        [rule, forward_fn](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, ScalarArg<I>... x,
                           const at::Tensor& state0) { return forward(rule, forward_fn, q, k, v, {x...}, state0); },
        ("(q, k, v" + scalars + ", state0) -> (o, final_state)").c_str());
  std::string dscalars;
  ((dscalars += std::string(", d") + kScalarNames[I]), ...);
  m.def(backward_fn.c_str(),
        [rule, backward_fn](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, ScalarArg<I>... x,
                            const at::Tensor& state0, const at::Tensor& dout, const at::Tensor& dfinal) {
          return pybind11::tuple(pybind11::cast(backward(rule, backward_fn, q, k, v, {x...}, state0, dout, dfinal)));
        },
        ("(q, k, v" + scalars + ", state0, do, dstate_final) -> (dq, dk, dv" + dscalars + ", dstate0)").c_str());
  m.def(step_fn.c_str(),
        [rule, step_fn](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, ScalarArg<I>... x,
                        const at::Tensor& state) { return step(rule, step_fn, q, k, v, {x...}, state); },
        ("(q, k, v" + scalars + ", state) -> o; T = 1, updates state in place").c_str());
}

}  // namespace
}  // namespace fw

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "Causal fast weight (sum, delta and gated delta rule) CUDA kernels; see csrc/cuda/README.md";
  m.attr("MAX_E") = fw::kMaxE;
  m.attr("MAX_M") = fw::kMaxM;
  fw::bind_rule(m, fw::Rule::kSum, "sum", std::make_index_sequence<0>());
  fw::bind_rule(m, fw::Rule::kDelta, "delta", std::make_index_sequence<1>());
  fw::bind_rule(m, fw::Rule::kGatedDelta, "gated_delta", std::make_index_sequence<2>());
}
