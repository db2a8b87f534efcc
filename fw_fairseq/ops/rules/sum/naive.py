"""The sum rule's reference: the maths of fw_fairseq/ops/README.md written as literal loops over time, the reference every fast path of the rule is
tested against.

Shapes (head-first): q, k [B, H, T, E]; v [B, H, T, M]; state W [B, H, E, M]. No normalisation or scaling
happens here. Everything runs in the inputs' dtype (tests use float64) and is differentiable by autograd (no
in-place updates of tensors autograd needs).
"""
import torch

from fw_fairseq.ops.rules.reference import steps, zero_state


def naive_sum(q, k, v, initial_state=None, output_final_state=False):
    """Causal sum rule: W_t = W_{t-1} + k_t v_t^T; o_t = W_t^T q_t. Returns (o [B,H,T,M], W or None)."""
    W = zero_state(k, v, initial_state)  # [B, H, E, M]
    outputs = []
    for q_t, k_t, v_t in zip(*steps(q, k, v)):  # [B, H, E], [B, H, E], [B, H, M]
        W = W + k_t[..., None] * v_t[:, :, None, :]  # [B, H, E, M]
        outputs.append(torch.einsum("bhe,bhem->bhm", q_t, W))  # [B, H, M]
    o = torch.stack(outputs, dim=2)  # [B, H, T, M]
    return o, (W if output_final_state else None)


def quadratic_sum(q, k, v, initial_state=None):
    """Second oracle for the sum rule, in attention form: o = (q k^T ⊙ causal) v + q W_0.

    Returns o [B, H, T, M] only (the final state is just W_0 + k^T v).
    """
    T = q.shape[2]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()  # [T, T], s <= t
    scores = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)  # [B, H, T, T]
    o = scores @ v  # [B, H, T, M]
    if initial_state is not None:
        o = o + q @ initial_state
    return o
