"""The delta rules' T = 1 forms (a decoding step): one outer-product update and one read, without the chunk
machinery's small-op overhead. The ungated rule is the gated one with alpha = 1 (alpha None skips the decay).
Same functions as the chunked forms at T = 1 (tests/ops/test_ops_step.py checks them against the naive loops,
outputs, states and gradients).

q, k [B, H, 1, E]; v [B, H, 1, M]; beta, alpha [B, H, 1]; state [B, H, E, M] or None (zero). Computed and
returned in guards.state_dtype (float32 for fp16/bf16 inputs).
"""
import torch

from fw_fairseq.ops.common.guards import state_dtype
from fw_fairseq.ops.common.outer import add_outer, add_outer_, cast
from fw_fairseq.ops.kernels.cpu_extension import cpu_kernel


def step_delta(q, k, v, beta, initial_state=None, output_final_state=False):
    """u = beta (v - k S), S + k^T u, o = q S."""
    return step_gated_delta(q, k, v, beta, None, initial_state, output_final_state)


def step_gated_delta(q, k, v, beta, alpha, initial_state=None, output_final_state=False):
    """S' = alpha S (alpha None: 1), u = beta (v - k S'), S' + k^T u, o = q S'."""
    q, k, v, beta, S0 = cast(state_dtype(q.dtype), initial_state, q, k, v, beta)
    if S0 is not None and alpha is not None:
        S0 = alpha.to(S0.dtype)[..., None] * S0  # [B, H, 1, 1] * [B, H, E, M]
    u = v if S0 is None else v - k @ S0  # [B, H, 1, M]: v - W_{t-1}^T k
    S = add_outer(S0, k, beta[..., None] * u)  # [B, H, E, M]
    return q @ S, (S if output_final_state else None)


def in_place_step_delta(q, k, v, beta, state, order=None, out=None):
    """in_place_step_gated_delta with alpha = 1."""
    return in_place_step_gated_delta(q, k, v, beta, None, state, order, out)


def in_place_step_gated_delta(q, k, v, beta, alpha, state, order=None, out=None):
    """Generation's step of the (gated) delta rule's state, no autograd through it: the hypotheses continue the rows
    `order` [B] of state [B', H, E, M] (beam search's reorder; None: all rows, in order), and their new state goes into
    `out` [B, H, E, M] (a contiguous storage apart from state; None: state itself, updated in place). Returns
    o [B, H, 1, M] = q S' + (q . k) u with S' = alpha S (alpha None: S), u = beta (v - k S').

    The out-of-place step writes a new [E, M] state per head and step, a fresh allocation that cost 2.1 ms against
    0.5 ms in place (B H = 128, E = 256, M = 64, one CPU thread); a reorder apart from the step copies every state
    first. The CPU kernel (csrc/cpu/state_step.cpp) reads each state once for q and k, gathered from its `order` row, and
    writes it once; the PyTorch form gathers, then steps in place."""
    out = state if out is None else out
    kernel = cpu_kernel(state)
    if kernel and state.is_contiguous() and out.is_contiguous():
        return kernel.state_step(q, k, v, beta, alpha, state, order, out)
    if order is not None:
        torch.index_select(state, 0, order, out=out)
    q, k, v = (x.to(out.dtype) for x in (q, k, v))
    if alpha is not None:
        out.mul_(alpha.to(out.dtype)[..., None])  # [B, H, 1, 1]: S' = alpha S
    read = torch.cat([q, k], dim=2) @ out  # [B, H, 2, M]: q S' and k S'
    u = beta.to(out.dtype)[..., None] * (v - read[:, :, 1:])  # [B, H, 1, M]
    o = read[:, :, :1] + (q * k).sum(-1, keepdim=True) * u  # q (S' + k^T u)
    add_outer_(out, k, u)
    return o
