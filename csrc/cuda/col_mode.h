// Plain C++ (no CUDA, no torch): shared by the binding, the launchers, the kernels and the emulator.
// (Named for the column modes; it also holds the limits that the column and row tiers are sized for.)
#pragma once

namespace fw {

// What the binding accepts (E rows and M columns of the state), exported by the extension as
// fw_fairseq._cuda.MAX_E / MAX_M (and by the emulator) so that the dispatch and the tests read them.
constexpr int kMaxE = 512, kMaxM = 160;

// What the column kernel does at each step t to each of its columns s = state[:, m] (a P-vector):
//   kSum:       s += k_t v_t[m];                           out_t[m] = q_t . s
//   kDelta:     u = beta_t (v_t[m] - k_t . s); s += k_t u;   out_t[m] = q_t . s;  aux_t[m] = k_t . s_old
//   kDeltaGrad: s += q_t v_t[m]; du = k_t . s; s -= beta_t du k_t;  out_t[m] = beta_t du;  aux_t[m] = du
// kDeltaGrad walks the delta rule's adjoint dL/dW_t backwards in time, with v = dL/do.
// The gated modes decay the column by alpha_t first (kGatedDelta: s = alpha_t s_old before the
// delta write, aux_t[m] = k_t . (alpha_t s_old)) or last (kGatedDeltaGrad: s = alpha_t (s - beta_t du k_t),
// the adjoint of that decay).
enum class ColMode { kSum, kDelta, kDeltaGrad, kGatedDelta, kGatedDeltaGrad };

constexpr bool is_gated(ColMode mode) { return mode == ColMode::kGatedDelta || mode == ColMode::kGatedDeltaGrad; }

}  // namespace fw
