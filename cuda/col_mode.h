// Plain C++ (no CUDA, no torch): shared by the binding, the launchers and the kernels.
#pragma once

namespace fw {

// What the column kernel does at each step t to each of its columns s = state[:, m] (a P-vector):
//   kSum:       s += k_t v_t[m];                           out_t[m] = q_t . s
//   kDelta:     u = beta_t (v_t[m] - k_t . s); s += k_t u;   out_t[m] = q_t . s;  aux_t[m] = k_t . s_old
//   kDeltaGrad: s += q_t v_t[m]; du = k_t . s; s -= beta_t du k_t;  out_t[m] = beta_t du;  aux_t[m] = du
// kDeltaGrad walks the delta rule's adjoint dL/dW_t backwards in time, with v = dL/do.
enum class ColMode { kSum, kDelta, kDeltaGrad };

}  // namespace fw
