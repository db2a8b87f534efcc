"""fast_weight_attend's short order, o = (q kᵀ ⊙ W) U, as an autograd Function with a hand-written backward.

    forward:  P = (q kᵀ) ⊙ W [B, H, Tq, T];  o = P U
    backward: dP = (dO Uᵀ) ⊙ W;  dq = dP k;  dk = dPᵀ q;  dU = Pᵀ dO

W is an optional constant weight per query and written position (a read whose kernel carries the positions,
dispatch.attend's `positions`); without it W is 1. The same matmuls autograd would run, but autograd
differentiates kᵀ, a view: it forms dkᵀ = qᵀ dP [E, T] and hands back its transpose, which was 1.6 times as slow
as dPᵀ q on a CPU (E = 256, T = 44) and made the feature map's backward copy it ([B, H, T, E]); here every
gradient comes out contiguous. First order only (guards.first_order). While torch.compile traces, and where
autograd records nothing, the plain product runs (`attend_short`).
"""
import torch

from fw_fairseq.ops.common.guards import first_order, hand_written_backward


def weigh(scores, weight):
    """scores [B, H, Tq, T] times weight [B, 1 or H, Tq, T] (None: 1)."""
    return scores if weight is None else scores * weight


class ScoresRead(torch.autograd.Function):
    """o [B, H, Tq, M] = ((q [B, H, Tq, E] k [B, H, T, E]ᵀ) ⊙ weight [B, 1 or H, Tq, T] or 1) u [B, H, T, M]."""

    @staticmethod
    def forward(ctx, q, k, u, weight):
        scores = weigh(q @ k.transpose(-1, -2), weight)  # [B, H, Tq, T]
        ctx.save_for_backward(q, k, u, scores, weight)
        return scores @ u

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, u, scores, weight = ctx.saved_tensors
        dq = dk = du = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            d_scores = weigh(grad @ u.transpose(-1, -2), weight)  # [B, H, Tq, T]
            dq = d_scores @ k if ctx.needs_input_grad[0] else None  # [B, H, Tq, E]
            dk = d_scores.transpose(-1, -2) @ q if ctx.needs_input_grad[1] else None  # [B, H, T, E]
        if ctx.needs_input_grad[2]:
            du = scores.transpose(-1, -2) @ grad  # [B, H, T, M]
        return dq, dk, du, None


def attend_short(q, k, u, weight=None):
    """((q kᵀ) ⊙ weight) u: the Function eagerly where autograd records, the plain product elsewhere. The weight
    is a constant: it gets no gradient."""
    if weight is not None and weight.requires_grad:
        raise ValueError("attend_short: the weight of the scores is a constant, it must not require grad")
    if hand_written_backward(q, k, u):
        return ScoresRead.apply(q, k, u, weight)
    return weigh(q @ k.transpose(-1, -2), weight) @ u
