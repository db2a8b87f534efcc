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
import triton

from fw_fairseq.ops.common.guards import first_order, records, state_dtype
from fw_fairseq.ops.maps.normalize_function import PHI_EPS
from fw_fairseq.ops.rules.delta import fused_backward_kernels as delta_backward_kernels, fused_kernels as delta_kernels
from fw_fairseq.ops.fused_read.launch import NUM_STAGES, block_t, check_heads, precision, rowwise

NORMS = ("sum", "l2")


def _strides(*tensors):
    return [s for x in tensors for s in x.stride()[:3]]


def _common(spec, q, k, v, beta, g, r, nq, nk, causal, norm):
    """The arguments every kernel takes first, the meta-parameters, the block length and the grid's B H."""
    B, H, Tq, d = q.shape
    T, M = k.shape[2], v.shape[-1]
    prec, acc = precision(q.dtype)
    bt = block_t(max(Tq, T))
    meta = dict(CAUSAL=causal, GATED=g is not None, L2=norm == "l2", MAP=spec.code, DB=spec.db,
                MB=max(16, triton.next_power_of_2(M)), EC=spec.ec, BT=bt, PREC=prec, ACC=acc, num_stages=NUM_STAGES)
    g = g if g is not None else beta  # a stand-in, never read ungated
    args = [q, k, v, beta, g, r, nq, nk, spec.proj(q), H, Tq, T, d, spec.E, spec.m, M, PHI_EPS,
            *_strides(q, k, v)]
    return args, meta, bt, B * H


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
    args, meta, bt, grid_bh = _common(spec, q, k, v, beta, g, r, nq, nk, causal, norm)
    delta_kernels.delta_writes[(grid_bh,)](*args, **meta)
    delta_kernels.delta_output[(grid_bh, triton.cdiv(Tq, bt))](*args, o, *_strides(o), **meta)
    return o, r, nq, nk


def delta_backward(spec, q, k, v, beta, g, causal, norm, r, o, nq, nk, do):
    """(dq, dk, dv, dbeta, dg): dq, dk, dv in their inputs' dtypes, dbeta and dg [B, H, T] in O's (dg None
    ungated)."""
    T = k.shape[2]
    args, meta, bt, grid_bh = _common(spec, q, k, v, beta, g, r, nq, nk, causal, norm)
    w = torch.empty_like(r)  # dU, then G in its place
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    dbeta = torch.empty_like(beta)
    dg = torch.empty_like(g) if g is not None else dbeta
    grads = [do, *_strides(do), w]
    key_grid, query_grid = (grid_bh, triton.cdiv(T, bt)), (grid_bh, triton.cdiv(q.shape[2], bt))
    delta_backward_kernels.delta_backward_du[key_grid](*args, *grads, **meta)
    delta_backward_kernels.delta_backward_solve[(grid_bh,)](*args, *grads, o, *_strides(o), dv, *_strides(dv),
                                                            dbeta, dg, **meta)
    delta_backward_kernels.delta_backward_k[key_grid](*args, *grads, dk, *_strides(dk), **meta)
    delta_backward_kernels.delta_backward_q[query_grid](*args, do, *_strides(do), o, *_strides(o), dq, *_strides(dq),
                                                         **meta)
    return dq, dk, dv, dbeta, (dg if g is not None else None)


class FusedDeltaRead(torch.autograd.Function):
    """O of the (gated) delta rule from raw heads (module docstring); g = cumsum(log alpha) or None; spec:
    launch.MapSpec; norm: "sum" or "l2"."""

    @staticmethod
    def forward(ctx, q, k, v, beta, g, spec, causal, norm):
        ctx.spec, ctx.causal, ctx.norm, ctx.beta_dtype = spec, causal, norm, beta.dtype
        beta = beta.to(state_dtype(q.dtype)).contiguous()
        o, r, nq, nk = delta_forward(spec, q, k, v, beta, g, causal, norm)
        ctx.save_for_backward(q, k, v, beta, g, r, o, nq, nk)
        return o

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, beta, g, r, o, nq, nk = ctx.saved_tensors
        dq, dk, dv, dbeta, dg = delta_backward(ctx.spec, q, k, v, beta, g, ctx.causal, ctx.norm, r, o, nq, nk,
                                               rowwise(grad))
        return dq, dk, dv, dbeta.to(ctx.beta_dtype), dg, None, None, None


def delta_read(spec, q, k, v, beta, alpha, causal, norm):
    """O [B, H, Tq, M]; spec: launch.MapSpec; alpha None for the (ungated) delta rule; norm 'sum' or 'l2'.
    Uses FusedDeltaRead.apply where autograd records (guards.records), the forward kernel alone otherwise."""
    scalars = {"beta": beta} if alpha is None else {"beta": beta, "alpha": alpha}
    check_heads("delta_read", q, k, v, scalars, causal)
    if norm not in NORMS:
        raise ValueError(f"delta_read: norm={norm!r}; allowed: 'sum', 'l2'")
    if q.shape[-1] != spec.d:
        raise ValueError(f"delta_read: q has head width {q.shape[-1]}, but the map takes d={spec.d}")
    q, k, v = (rowwise(x) for x in (q, k, v))
    dtype = state_dtype(q.dtype)
    g = None if alpha is None else alpha.to(dtype).log().cumsum(-1).contiguous()  # [B, H, T]
    if records(q, k, v, beta, g):
        return FusedDeltaRead.apply(q, k, v, beta, g, spec, causal, norm)
    return delta_forward(spec, q, k, v, beta.to(dtype).contiguous(), g, causal, norm)[0]
