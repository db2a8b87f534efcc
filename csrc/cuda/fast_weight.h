// Launchers shared by the binding (fast_weight.cpp: checks, allocation, pass order) and the kernels
// (*.cu). Every tensor is contiguous and on the current device; an undefined tensor means "absent".
// Shapes are head-first: [B, H, T, D] sequences, [B, H, P, Q] states; acc_t (float, or double for
// float64 inputs) is the state's and the scratch buffers' dtype.
#pragma once
#include <ATen/core/Tensor.h>

#include <string>

#include "col_mode.h"

namespace fw {

// Numbers in TORCH_CHECK messages go in as text made here, never through std::ostream's number
// formatting. On the first GPU run (H100, 2026-11-25, the extension built by that node's g++ under
// /opt/gcc), every check whose message streamed an integer or a shape segfaulted instead of raising,
// while the checks that streamed only text, dtypes and devices raised their RuntimeError; std::to_string
// formats without a stream or a locale.
inline std::string num(int64_t x) { return std::to_string(x); }

inline std::string dims(at::IntArrayRef shape) {  // "[1, 2, 5, 16]", as torch prints a shape
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

// q, k [B, H, T, P]; v [B, H, T, Q]; beta [B, H, T] (delta modes); alpha [B, H, T] (gated modes);
// state_in, state_out [B, H, P, Q]; out and aux [B, H, T, Q] in acc_t. reverse walks t = T-1 .. 0.
void launch_col(ColMode mode, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& beta, const at::Tensor& alpha, const at::Tensor& state_in,
                const at::Tensor& state_out,
                const at::Tensor& out, const at::Tensor& aux, bool reverse);

// launch_col's arguments as one bundle, for the per-mode launchers.
struct ColTensors {
  const at::Tensor &q, &k, &v, &beta, &alpha, &state_in, &state_out, &out, &aux;
  bool reverse;
};

// One mode of launch_col, instantiated in its rule's own file (columns_sum.cu, columns_delta.cu,
// columns_gated.cu) so that a parallel build compiles the three at once (col_launch.cuh).
template <ColMode kMode>
void launch_col_mode(const ColTensors& t);

// The (gated, if alpha is defined) delta rule's dq, dk, dbeta from the rows of W (forward sweep) and
// of dL/dW (reverse sweep), given vbar (k(Gated)Delta's aux) and du (k(Gated)DeltaGrad's aux), both
// [B, H, T, M] in acc_t. dk_part [B, H, T, E] (acc_t) is scratch that carries
// -beta_t alpha_t W_{t-1} du_t between the sweeps.
void launch_delta_grad_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& beta, const at::Tensor& alpha, const at::Tensor& dout,
                            const at::Tensor& vbar,
                            const at::Tensor& du, const at::Tensor& state0, const at::Tensor& dfinal,
                            const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dbeta,
                            const at::Tensor& dk_part);

// One decoding step (T = 1) that updates state [B, H, E, M] in place and writes o [B, H, 1, M] (acc_t);
// alpha [B, H, 1] (gated delta rule) or undefined.
void launch_step(bool delta, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& beta, const at::Tensor& alpha, const at::Tensor& state, const at::Tensor& o);

}  // namespace fw
