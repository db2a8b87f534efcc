"""The delta rules' short read from the raw heads on the CPU kernel (csrc/cpu/delta_attend.cpp; the delta rule's
record's `short`), phi normalised (--fw-delta-norm), causal (one chunk of the chunked form, README §2 with no state)
or not (the short order: every query reads the memory after the last write):
    P = phi(q) phi(k)^T (tril where causal),  X = tril(phi(k) phi(k)^T, -1),  (I + diag(beta) X) U = diag(beta) V,
    O = P U
all of it in the kernel (U by forward substitution, its backward by back substitution), which returns O and keeps
U for the backward; then dphi(q) = dP phi(k), dphi(k) = dP^T phi(q) + (dX + dX^T) phi(k) and the map's backward, in
the kernel. First order only (guards.first_order).
"""
import torch

from fw_fairseq.ops.common.chunking import DELTA_ONE_CHUNK_MAX
from fw_fairseq.ops.common.guards import first_order, records
from fw_fairseq.ops.common.read_order import short_order
from fw_fairseq.ops.kernels import cpu_extension
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_NORMS
from fw_fairseq.ops.maps.normalize_function import PHI_EPS


class DeltaRead(torch.autograd.Function):
    """O [B, H, Tq, M] of the delta rule from q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M], beta [B, H, T]
    (module docstring); map: the kernel's (code, nu, projection); norm: KERNEL_NORMS' code."""

    @staticmethod
    def forward(ctx, q, k, v, beta, map, causal, norm, kernel):
        out, writes = kernel.delta_attend_forward(q, k, v, beta, *map, causal, norm, PHI_EPS, cpu_extension.BLAS)  # O, U
        ctx.save_for_backward(q, k, v, beta, writes, map[2])
        ctx.map, ctx.causal, ctx.norm, ctx.kernel = map[:2], causal, norm, kernel
        return out

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, beta, writes, projection = ctx.saved_tensors
        dq, dk, dv, dbeta = ctx.kernel.delta_attend_backward(grad, writes, q, k, v, beta, *ctx.map, projection,
                                                             ctx.causal, ctx.norm, PHI_EPS, cpu_extension.BLAS)
        return dq, dk, dv, dbeta, None, None, None, None


def delta_short_read(kernel, map, width, q, k, v, scalars, causal, norm, key_padding_mask):
    """The delta rule's short read (its record's `short`)."""
    Tq, T = q.shape[2], k.shape[2]
    # several chunks carry a state (the chunked form); a non-causal read in the memory's order forms the memory
    if T > DELTA_ONE_CHUNK_MAX or not (causal or short_order(Tq, T, width, v.shape[-1])):
        return None
    code, beta = KERNEL_NORMS[norm], scalars[0]  # beta [B, H, T]: 0 at padded positions (their v rows too)
    if records(q, k, v, beta):
        return DeltaRead.apply(q, k, v, beta, map, causal, code, kernel)
    return kernel.delta_attend_forward(q, k, v, beta, *map, causal, code, PHI_EPS, cpu_extension.BLAS)[0]
