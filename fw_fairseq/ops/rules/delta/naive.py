"""The delta rules' reference: the maths of fw_fairseq/ops/README.md written as literal loops over time, the reference every fast path of the rule is
tested against.

Shapes (head-first): q, k [B, H, T, E]; v [B, H, T, M]; beta, alpha [B, H, T]; state W [B, H, E, M]. No normalisation or scaling
happens here. Everything runs in the inputs' dtype (tests use float64) and is differentiable by autograd (no
in-place updates of tensors autograd needs).
"""
import torch

from fw_fairseq.ops.rules.reference import steps, zero_state


def naive_delta(q, k, v, beta, initial_state=None, output_final_state=False):
    """Causal delta rule (paper §4.2): vbar_t = W_{t-1}^T k_t; W_t = W_{t-1} + beta_t k_t (v_t - vbar_t)^T;
    o_t = W_t^T q_t. Returns (o [B,H,T,M], W or None)."""
    W = zero_state(k, v, initial_state)  # [B, H, E, M]
    outputs = []
    for q_t, k_t, v_t, beta_t in zip(*steps(q, k, v, beta)):  # [B, H, E], [B, H, E], [B, H, M], [B, H]
        v_bar = torch.einsum("bhe,bhem->bhm", k_t, W)  # [B, H, M]
        delta = beta_t[..., None] * (v_t - v_bar)  # [B, H, M]
        W = W + k_t[..., None] * delta[:, :, None, :]  # [B, H, E, M]
        outputs.append(torch.einsum("bhe,bhem->bhm", q_t, W))  # [B, H, M]
    o = torch.stack(outputs, dim=2)  # [B, H, T, M]
    return o, (W if output_final_state else None)


def naive_gated_delta(q, k, v, beta, alpha, initial_state=None, output_final_state=False):
    """Causal gated delta rule (Gated DeltaNet, Yang et al. 2024): the state decays by alpha_t in (0, 1]
    before the delta write, W_t = alpha_t W_{t-1} + beta_t k_t (v_t - alpha_t W_{t-1}^T k_t)^T;
    o_t = W_t^T q_t (alpha = 1 is naive_delta). Returns (o [B,H,T,M], W or None)."""
    W = zero_state(k, v, initial_state)  # [B, H, E, M]
    outputs = []
    for q_t, k_t, v_t, beta_t, alpha_t in zip(*steps(q, k, v, beta, alpha)):  # alpha_t: [B, H]
        W = alpha_t[..., None, None] * W  # [B, H, E, M], the decayed memory the write corrects
        v_bar = torch.einsum("bhe,bhem->bhm", k_t, W)  # [B, H, M]
        delta = beta_t[..., None] * (v_t - v_bar)  # [B, H, M]
        W = W + k_t[..., None] * delta[:, :, None, :]  # [B, H, E, M]
        outputs.append(torch.einsum("bhe,bhem->bhm", q_t, W))  # [B, H, M]
    o = torch.stack(outputs, dim=2)  # [B, H, T, M]
    return o, (W if output_final_state else None)
