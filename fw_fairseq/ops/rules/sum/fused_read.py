"""The sum rule's fused read as an autograd Function: launches fused_kernels.py's three kernels.

y [B, H, Tq, M] = A v of the raw heads q [B, H, Tq, d], k [B, H, T, d] and values v [B, H, T, M] (fused_kernels.py's
docstring), in float32 for half heads (guards.state_dtype). y is allocated as [Tq, B, H, M] and returned as its
[B, H, Tq, M] view, so that the module's merge of heads into [Tq, B, C] is a view, not a copy. Saved for the
backward: the heads, y and n [B, H, Tq]. First order only (guards.first_order).

align: None, or (P, qa [B, Tq], kb [B, T]): the aligned cross-attention's weight cos^(2P)((a_i - b_j) / 2) of the
queries' and keys' angles on the scores (fused_kernels.py), a constant without a gradient.
"""
import torch

from fw_fairseq.ops.common.guards import first_order, state_dtype
from fw_fairseq.ops.common.z_column import Z_EPS
from fw_fairseq.ops.fused_read.launch import grid, meta, rowwise, sizes, strides
from fw_fairseq.ops.rules.sum import fused_kernels as sum_kernels


def _launch_args(spec, q, k, v, mask, causal, align):
    """(the kernels' meta-parameters, the arguments they take after the heads' tensors: the pointers mask, proj, qa,
    kb, with 1-element stand-ins for those not given, then the sizes)."""
    flags = dict(CAUSAL=causal, HAS_MASK=mask is not None, ALIGN=0 if align is None else align[0])
    mask = mask if mask is not None else q.new_zeros(1, dtype=torch.uint8)
    angles = (q.new_zeros(1, dtype=state_dtype(q.dtype)),) * 2 if align is None else kernel_align(q.dtype, align)[1:]
    return meta(spec, q, k, v, **flags), (mask, spec.proj(q), *angles, *sizes(spec, q, k, v))


def kernel_align(dtype, align):
    """align (P, qa, kb) with the angles in the kernels' dtype for heads of `dtype` (their accumulation's,
    guards.state_dtype), contiguous: a no-op on angles already converted, so that the backward reuses the forward's."""
    if align is None:
        return None
    order, *angles = align
    return (order, *(x.to(state_dtype(dtype)).contiguous() for x in angles))


def sum_forward(spec, q, k, v, mask, causal, align=None):
    """(y [B, H, Tq, M], n [B, H, Tq]); mask: [B, T] uint8 (nonzero at padding) or None."""
    B, H, Tq, _ = q.shape
    kernel_meta, args = _launch_args(spec, q, k, v, mask, causal, align)
    dtype = state_dtype(q.dtype)
    y = torch.empty(Tq, B, H, v.shape[-1], dtype=dtype, device=q.device).permute(1, 2, 0, 3)  # [B, H, Tq, M] view
    n = torch.empty(B, H, Tq, dtype=dtype, device=q.device)
    sum_kernels.sum_forward[grid(q, kernel_meta, Tq)](q, k, v, y, n, *args, Z_EPS, *strides(q, k, v, y),
                                                      **kernel_meta)
    return y, n


def sum_backward(spec, q, k, v, mask, causal, y, n, dy, align=None):
    """(dq, dk, dv), each with its input's strides and dtype."""
    kernel_meta, args = _launch_args(spec, q, k, v, mask, causal, align)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    common = strides(q, k, v, y, dy)
    sum_kernels.sum_backward_q[grid(q, kernel_meta, q.shape[2])](q, k, v, y, dy, n, dq, *args, *common,
                                                                 **kernel_meta)
    sum_kernels.sum_backward_kv[grid(q, kernel_meta, k.shape[2])](q, k, v, y, dy, n, dk, dv, *args, *common,
                                                                  **kernel_meta)
    return dq, dk, dv


class FusedSumRead(torch.autograd.Function):
    """y = A v of the sum rule from raw heads (module docstring); spec: launch.MapSpec; align: None or
    (P, qa, kb)."""

    @staticmethod
    def forward(ctx, q, k, v, mask, spec, causal, align=None):
        align = kernel_align(q.dtype, align)
        y, n = sum_forward(spec, q, k, v, mask, causal, align)
        ctx.save_for_backward(q, k, v, mask, y, n)
        ctx.spec, ctx.causal, ctx.align = spec, causal, align
        return y

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, mask, y, n = ctx.saved_tensors
        dq, dk, dv = sum_backward(ctx.spec, q, k, v, mask, ctx.causal, y, n, rowwise(grad), ctx.align)
        return dq, dk, dv, None, None, None, None
