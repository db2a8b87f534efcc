"""The sum rule's fused read as an autograd Function: launches fused_kernels.py's three kernels.

y [B, H, Tq, M] = A v of the raw heads q [B, H, Tq, d], k [B, H, T, d] and values v [B, H, T, M] (fused_kernels.py's
docstring), in float32 for half heads (guards.state_dtype). y is allocated as [Tq, B, H, M] and returned as its
[B, H, Tq, M] view, so that the module's merge of heads into [Tq, B, C] is a view, not a copy. Saved for the
backward: the heads, y and n [B, H, Tq]. First order only (guards.first_order).
"""
import torch
import triton

from fw_fairseq.ops.common.guards import first_order, state_dtype
from fw_fairseq.ops.common.z_column import Z_EPS
from fw_fairseq.ops.rules.sum import fused_kernels as sum_kernels
from fw_fairseq.ops.fused_read.launch import NUM_STAGES, block_t, precision, rowwise


def _launch_args(spec, q, k, v, mask):
    B, H, Tq, d = q.shape
    T, M = k.shape[2], v.shape[-1]
    prec, acc = precision(q.dtype)
    bt = block_t(max(Tq, T))
    meta = dict(HAS_MASK=mask is not None, MAP=spec.code, DB=spec.db, MB=max(16, triton.next_power_of_2(M)),
                EC=spec.ec, BT=bt, PREC=prec, ACC=acc, num_stages=NUM_STAGES)
    sizes = (H, Tq, T, d, spec.E, spec.m, M)
    mask = mask if mask is not None else q.new_zeros(1, dtype=torch.uint8)
    return B * H, bt, meta, sizes, mask


def _strides(*tensors):
    return [s for x in tensors for s in x.stride()[:3]]


def sum_forward(spec, q, k, v, mask, causal):
    """(y [B, H, Tq, M], n [B, H, Tq]); mask: [B, T] uint8 (nonzero at padding) or None."""
    B, H, Tq, _ = q.shape
    M = v.shape[-1]
    grid_bh, bt, meta, sizes, mask_arg = _launch_args(spec, q, k, v, mask)
    dtype = state_dtype(q.dtype)
    y = torch.empty(Tq, B, H, M, dtype=dtype, device=q.device).permute(1, 2, 0, 3)  # [B, H, Tq, M] view
    n = torch.empty(B, H, Tq, dtype=dtype, device=q.device)
    sum_kernels.sum_forward[(grid_bh, triton.cdiv(Tq, bt))](
        q, k, v, y, n, mask_arg, spec.proj(q), *sizes, Z_EPS, *_strides(q, k, v, y), CAUSAL=causal, **meta)
    return y, n


def sum_backward(spec, q, k, v, mask, causal, y, n, dy):
    """(dq, dk, dv), each with its input's strides and dtype."""
    Tq, T = q.shape[2], k.shape[2]
    grid_bh, bt, meta, sizes, mask_arg = _launch_args(spec, q, k, v, mask)
    proj = spec.proj(q)
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    common = _strides(q, k, v, y, dy)
    sum_kernels.sum_backward_q[(grid_bh, triton.cdiv(Tq, bt))](
        q, k, v, y, dy, n, dq, mask_arg, proj, *sizes, *common, CAUSAL=causal, **meta)
    sum_kernels.sum_backward_kv[(grid_bh, triton.cdiv(T, bt))](
        q, k, v, y, dy, n, dk, dv, mask_arg, proj, *sizes, *common, CAUSAL=causal, **meta)
    return dq, dk, dv


class FusedSumRead(torch.autograd.Function):
    """y = A v of the sum rule from raw heads (module docstring); spec: launch.MapSpec."""

    @staticmethod
    def forward(ctx, q, k, v, mask, spec, causal):
        y, n = sum_forward(spec, q, k, v, mask, causal)
        ctx.save_for_backward(q, k, v, mask, y, n)
        ctx.spec, ctx.causal = spec, causal
        return y

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, mask, y, n = ctx.saved_tensors
        dq, dk, dv = sum_backward(ctx.spec, q, k, v, mask, ctx.causal, y, n, rowwise(grad))
        return dq, dk, dv, None, None, None
