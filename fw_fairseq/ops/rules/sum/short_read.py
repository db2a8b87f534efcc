"""The sum rule's short read from the raw heads on the CPU kernel (csrc/cpu/feature_attend.cpp; its record's
`short`): a short sequence reads in the order (q k^T) v, the kernel forming phi of one head's rows in a buffer that
stays in cache (fw_fairseq/ops/README.md §12). Through the z column:
    y = W^T phi(q) / (z . phi(q) + Z_EPS) = A v,   A = P / (rowsum(P) + Z_EPS),   P = mask(phi(q) phi(k)^T)
as softmax attention computes its weights and then A v. Backward: dA = dy v^T, dv = A^T dy, and in the kernel
dP = (dA - rowsum(dA * A)) / s, then dphi(q) = dP phi(k), dphi(k) = dP^T phi(q) and the map's backward. A padded key
reads nothing: the kernel sets its row of phi to 0 (its dk is 0). First order only (guards.first_order).
"""
import torch

from fw_fairseq.ops.common.chunking import SUM_CHUNK_SIZE
from fw_fairseq.ops.common.guards import first_order, records
from fw_fairseq.ops.common.read_order import short_order
from fw_fairseq.ops.common.z_column import Z_EPS
from fw_fairseq.ops.kernels import cpu_extension


class SumRead(torch.autograd.Function):
    """y [B, H, Tq, M] = A v from q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M] (module docstring); map: the
    kernel's (code, nu, projection)."""

    @staticmethod
    def forward(ctx, q, k, v, pad, map, causal, kernel):
        weights, sums = kernel.feature_attend_forward(q, k, pad, *map, causal, Z_EPS, cpu_extension.BLAS)  # [B,H,Tq,T], [B,H,Tq]
        ctx.save_for_backward(q, k, v, weights, sums, pad, map[2])  # FAVOR+'s R saved: a redraw in place is caught
        ctx.map, ctx.causal, ctx.kernel = map[:2], causal, kernel
        return weights @ v

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, weights, sums, pad, projection = ctx.saved_tensors
        dq = dk = dv = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            d_weights = grad @ v.transpose(-1, -2)  # [B, H, Tq, T]
            dq, dk = ctx.kernel.feature_attend_backward(d_weights, weights, sums, q, k, pad, *ctx.map, projection,
                                                        ctx.causal, Z_EPS, cpu_extension.BLAS)
        if ctx.needs_input_grad[2]:
            dv = weights.transpose(-1, -2) @ grad  # [B, H, T, M]
        return dq, dk, dv, None, None, None, None


def sum_short_read(kernel, map, width, q, k, v, scalars, causal, norm, key_padding_mask):
    """The sum rule's short read (its record's `short`)."""
    Tq, T = q.shape[2], k.shape[2]
    if not (T <= SUM_CHUNK_SIZE if causal else short_order(Tq, T, width, v.shape[-1] + 1)):
        return None  # the rule forms the memory (or chunks) instead: the kernel has no cheaper order there
    # the kernel sets the features of padded keys to 0: their columns of P are 0
    if records(q, k, v):
        return SumRead.apply(q, k, v, key_padding_mask, map, causal, kernel)
    return kernel.feature_attend_forward(q, k, key_padding_mask, *map, causal, Z_EPS, cpu_extension.BLAS)[0] @ v
