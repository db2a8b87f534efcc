"""The reference: DESIGN.md §1 written as literal loops over time. Every fast path is tested against it.

Shapes (head-first): q, k [B, H, T, E]; v [B, H, T, M]; beta, alpha [B, H, T]; state W [B, H, E, M].
No normalisation or scaling happens here. Everything runs in the inputs' dtype (tests use float64)
and is differentiable by autograd (no in-place updates of tensors autograd needs).
"""
import torch


def _zero_state(k, v, initial_state):
    if initial_state is not None:
        return initial_state
    B, H, _, E = k.shape
    return k.new_zeros(B, H, E, v.shape[-1])  # [B, H, E, M]


def _steps(*tensors):
    """Per-position slices along T (dim 2). unbind, not x[:, :, t]: the backward of T index ops would
    build T full-size zero gradients (O(T^2) work); unbind's backward stacks once."""
    return [x.unbind(2) for x in tensors]


def naive_sum(q, k, v, initial_state=None, output_final_state=False):
    """Causal sum rule: W_t = W_{t-1} + k_t v_t^T; o_t = W_t^T q_t. Returns (o [B,H,T,M], W or None)."""
    W = _zero_state(k, v, initial_state)  # [B, H, E, M]
    outputs = []
    for q_t, k_t, v_t in zip(*_steps(q, k, v)):  # [B, H, E], [B, H, E], [B, H, M]
        W = W + k_t[..., None] * v_t[:, :, None, :]  # [B, H, E, M]
        outputs.append(torch.einsum("bhe,bhem->bhm", q_t, W))  # [B, H, M]
    o = torch.stack(outputs, dim=2)  # [B, H, T, M]
    return o, (W if output_final_state else None)


def naive_delta(q, k, v, beta, initial_state=None, output_final_state=False):
    """Causal delta rule (paper §4.2): vbar_t = W_{t-1}^T k_t; W_t = W_{t-1} + beta_t k_t (v_t - vbar_t)^T;
    o_t = W_t^T q_t. Returns (o [B,H,T,M], W or None)."""
    W = _zero_state(k, v, initial_state)  # [B, H, E, M]
    outputs = []
    for q_t, k_t, v_t, beta_t in zip(*_steps(q, k, v, beta)):  # [B, H, E], [B, H, E], [B, H, M], [B, H]
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
    W = _zero_state(k, v, initial_state)  # [B, H, E, M]
    outputs = []
    for q_t, k_t, v_t, beta_t, alpha_t in zip(*_steps(q, k, v, beta, alpha)):  # alpha_t: [B, H]
        W = alpha_t[..., None, None] * W  # [B, H, E, M], the decayed memory the write corrects
        v_bar = torch.einsum("bhe,bhem->bhm", k_t, W)  # [B, H, M]
        delta = beta_t[..., None] * (v_t - v_bar)  # [B, H, M]
        W = W + k_t[..., None] * delta[:, :, None, :]  # [B, H, E, M]
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


def naive_noncausal(q, k, v, beta=None, alpha=None):
    """Non-causal memory read: W = state after writing all T positions of k, v (sum rule if beta is
    None, delta writes in order t = 1..T from W = 0 if alpha is None, else gated delta writes); o = q W.

    q: [B, H, Tq, E] (Tq may differ from T); k: [B, H, T, E]; v: [B, H, T, M]. Returns o [B, H, Tq, M].
    """
    if beta is None:
        W = torch.einsum("bhte,bhtm->bhem", k, v)  # [B, H, E, M]
    elif alpha is not None:
        _, W = naive_gated_delta(k, k, v, beta, alpha, output_final_state=True)  # W: [B, H, E, M]
    else:
        _, W = naive_delta(k, k, v, beta, output_final_state=True)  # outputs unused, W: [B, H, E, M]
    return q @ W  # [B, H, Tq, M]
