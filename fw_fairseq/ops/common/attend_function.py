"""fast_weight_attend's short order, o = (q kᵀ) U, as an autograd Function with a hand-written backward.

    forward:  P = q kᵀ [B, H, Tq, T];  o = P U
    backward: dP = dO Uᵀ;  dq = dP k;  dk = dPᵀ q;  dU = Pᵀ dO

The same matmuls autograd would run, but autograd differentiates kᵀ, a view: it forms dkᵀ = qᵀ dP
[E, T] and hands back its transpose, which was 1.6 times as slow as dPᵀ q on a CPU (E = 256, T = 44)
and made the feature map's backward copy it ([B, H, T, E]); here every gradient comes out contiguous.
First order only (guards.first_order). While torch.compile traces, and where autograd records nothing,
the plain product runs (`attend_short`).
"""
import torch

from fw_fairseq.ops.common.guards import first_order, hand_written_backward


class ScoresRead(torch.autograd.Function):
    """o [B, H, Tq, M] = (q [B, H, Tq, E] k [B, H, T, E]ᵀ) u [B, H, T, M]."""

    @staticmethod
    def forward(ctx, q, k, u):
        scores = q @ k.transpose(-1, -2)  # [B, H, Tq, T]
        ctx.save_for_backward(q, k, u, scores)
        return scores @ u

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, u, scores = ctx.saved_tensors
        dq = dk = du = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            d_scores = grad @ u.transpose(-1, -2)  # [B, H, Tq, T]
            dq = d_scores @ k if ctx.needs_input_grad[0] else None  # [B, H, Tq, E]
            dk = d_scores.transpose(-1, -2) @ q if ctx.needs_input_grad[1] else None  # [B, H, T, E]
        if ctx.needs_input_grad[2]:
            du = scores.transpose(-1, -2) @ grad  # [B, H, T, M]
        return dq, dk, du


def attend_short(q, k, u):
    """(q kᵀ) u: the Function eagerly where autograd records, the plain product elsewhere."""
    if hand_written_backward(q, k, u):
        return ScoresRead.apply(q, k, u)
    return (q @ k.transpose(-1, -2)) @ u
