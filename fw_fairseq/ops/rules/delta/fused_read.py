"""The delta rule's fused read as an autograd Function: launches fused_kernels.py's two forward and
fused_backward_kernels.py's four backward kernels.

O [B, H, Tq, M] of the (gated) delta rule over phi of the raw heads q [B, H, Tq, d], k [B, H, T, d], normalised per
row (norm "sum" or "l2"), values v [B, H, T, M] and beta [B, H, T] (0 at padded positions, where v is 0 too), alpha
[B, H, T] in (0, 1] or None (1 at padded positions): causal (Tq = T, one chunk of chunked_gated_delta) or not (every
query reads the memory after the last write, fast_weight_attend). In float32 for half heads (guards.state_dtype); O is
allocated as [Tq, B, H, M] and returned as its [B, H, Tq, M] view, so that the module's merge of heads into
[Tq, B, C] is a view, not a copy. The gates enter as g = cumsum(log alpha) [B, H, T], formed here with autograd,
which takes the kernels' dg back to alpha. Saved for the backward: the heads, R [B, H, T, M] (fused_kernels.py),
O and the rows' unclamped norms [B, H, Tq], [B, H, T]. First order only (guards.first_order).
"""
import torch

from fw_fairseq.ops.common.guards import first_order, records, state_dtype
from fw_fairseq.ops.fused_read.launch import grid, meta, rowwise, sizes, strides
from fw_fairseq.ops.maps.normalize_function import PHI_EPS
from fw_fairseq.ops.rules.delta import fused_backward_kernels as delta_backward_kernels, fused_kernels as delta_kernels


def _common(spec, q, k, v, beta, g, r, nq, nk, causal, norm):
    """(the arguments every kernel takes first, the meta-parameters)."""
    kernel_meta = meta(spec, q, k, v, CAUSAL=causal, GATED=g is not None, L2=norm == "l2")
    g = g if g is not None else beta  # a stand-in, never read ungated
    args = [q, k, v, beta, g, r, nq, nk, spec.proj(q), *sizes(spec, q, k, v), PHI_EPS, *strides(q, k, v)]
    return args, kernel_meta


def delta_forward(spec, q, k, v, beta, g, causal, norm):
    """(O [B, H, Tq, M], R [B, H, T, M], nq [B, H, Tq], nk [B, H, T]); beta, g: [B, H, T] contiguous in O's dtype
    (g None ungated)."""
    B, H, Tq, _ = q.shape
    T, M = k.shape[2], v.shape[-1]
    dtype = state_dtype(q.dtype)
    o = torch.empty(Tq, B, H, M, dtype=dtype, device=q.device).permute(1, 2, 0, 3)  # [B, H, Tq, M] view
    r = torch.empty(B, H, T, M, dtype=dtype, device=q.device)
    nq = torch.empty(B, H, Tq, dtype=dtype, device=q.device)
    nk = torch.empty(B, H, T, dtype=dtype, device=q.device)
    args, kernel_meta = _common(spec, q, k, v, beta, g, r, nq, nk, causal, norm)
    delta_kernels.delta_writes[grid(q, kernel_meta)](*args, **kernel_meta)
    delta_kernels.delta_output[grid(q, kernel_meta, Tq)](*args, o, *strides(o), **kernel_meta)
    return o, r, nq, nk


def delta_backward(spec, q, k, v, beta, g, causal, norm, r, o, nq, nk, do):
    """(dq, dk, dv, dbeta, dg): dq, dk, dv in their inputs' dtypes, dbeta and dg [B, H, T] in O's (dg None
    ungated)."""
    args, kernel_meta = _common(spec, q, k, v, beta, g, r, nq, nk, causal, norm)
    w = torch.empty_like(r)  # dU, then G in its place
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    dbeta = torch.empty_like(beta)
    dg = torch.empty_like(g) if g is not None else dbeta
    grads = [do, *strides(do), w]
    key_grid, query_grid = grid(q, kernel_meta, k.shape[2]), grid(q, kernel_meta, q.shape[2])
    delta_backward_kernels.delta_backward_du[key_grid](*args, *grads, **kernel_meta)
    delta_backward_kernels.delta_backward_solve[grid(q, kernel_meta)](*args, *grads, o, *strides(o), dv,
                                                                      *strides(dv), dbeta, dg, **kernel_meta)
    delta_backward_kernels.delta_backward_k[key_grid](*args, *grads, dk, *strides(dk), **kernel_meta)
    delta_backward_kernels.delta_backward_q[query_grid](*args, do, *strides(do), o, *strides(o), dq, *strides(dq),
                                                         **kernel_meta)
    return dq, dk, dv, dbeta, (dg if g is not None else None)


class FusedDeltaRead(torch.autograd.Function):
    """O of the (gated) delta rule from raw heads (module docstring); beta [B, H, T] contiguous in O's dtype,
    g = cumsum(log alpha) or None; spec: launch.MapSpec; norm: "sum" or "l2"."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, spec, causal, norm):
        ctx.spec, ctx.causal, ctx.norm = spec, causal, norm
        o, r, nq, nk = delta_forward(spec, q, k, v, beta, g, causal, norm)
        ctx.save_for_backward(q, k, v, beta, g, r, o, nq, nk)
        return o

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, beta, g, r, o, nq, nk = ctx.saved_tensors
        dq, dk, dv, dbeta, dg = delta_backward(ctx.spec, q, k, v, beta, g, ctx.causal, ctx.norm, r, o, nq, nk,
                                               rowwise(grad))
        return dq, dk, dv, dbeta, dg, None, None, None


def delta_read(spec, q, k, v, beta, alpha, causal, norm):
    """O [B, H, Tq, M]; spec: launch.MapSpec; alpha None for the (ungated) delta rule; norm 'sum' or 'l2'; the heads
    and scalars as fused_read/dispatch.read passes them, checked (launch.checked_heads). Uses FusedDeltaRead.apply
    where autograd records (guards.records), the forward kernels alone otherwise."""
    dtype = state_dtype(q.dtype)
    # the module's scalars are fp32 beside half heads; the cast is recorded, so dbeta returns in beta's dtype
    beta = beta.to(dtype).contiguous()
    g = None if alpha is None else alpha.to(dtype).log().cumsum(-1).contiguous()  # [B, H, T]
    if records(q, k, v, beta, g):
        return FusedDeltaRead.apply(q, k, v, beta, g, spec, causal, norm)
    return delta_forward(spec, q, k, v, beta, g, causal, norm)[0]
