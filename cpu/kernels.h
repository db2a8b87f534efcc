// The CPU extension fw_fairseq._cpu (setup.py builds cpu/*.cpp into it; bindings in extension.cpp).
#pragma once

#include <torch/extension.h>

// The row loops are compiled twice, for AVX2 and for the baseline x86-64 (or the target's default),
// and the loader picks by the CPU (GCC/Clang function multiversioning): AVX2 ran the backward 2.6x
// faster than SSE2 on the 2-core CPU, and a build may run on another machine than the one it was made on.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FW_CLONES
#endif

// dpfp.cpp: DPFP-nu's forward (normalised if asked: norm 0 none, 1 sum, 2 l2) and backward, and
// rows . phi(raw keys) for the decoding cache
torch::Tensor dpfp_forward(const torch::Tensor& x, int64_t nu, int64_t norm, double eps);
torch::Tensor dpfp_backward(const torch::Tensor& grad, const torch::Tensor& x, int64_t nu);
torch::Tensor dpfp_scores(const torch::Tensor& rows, const torch::Tensor& keys, int64_t nu);

// lazy_step.cpp: a decoding step of the lazy cache of raw keys -> (o, u)
std::tuple<torch::Tensor, torch::Tensor> dpfp_lazy_step(const torch::Tensor& phi_q, const torch::Tensor& phi_k,
                                                        const torch::Tensor& v, const c10::optional<torch::Tensor>& beta,
                                                        const torch::Tensor& keys, const torch::Tensor& writes,
                                                        const c10::optional<torch::Tensor>& decay, int64_t nu,
                                                        const c10::optional<torch::Tensor>& order,
                                                        const c10::optional<torch::Tensor>& keys_out,
                                                        const c10::optional<torch::Tensor>& writes_out);

// state_step.cpp: a decoding step of the fast weight state, beam search's reorder folded in
torch::Tensor state_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const c10::optional<torch::Tensor>& beta, const c10::optional<torch::Tensor>& alpha,
                         const torch::Tensor& state, const c10::optional<torch::Tensor>& order, torch::Tensor out);
