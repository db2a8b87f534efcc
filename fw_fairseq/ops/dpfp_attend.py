"""The sum rule's normalised read in the short order with DPFP features, from the raw heads, on the CPU kernel.

    y = W^T phi(q) / (z . phi(q) + Z_EPS),  W = sum_s phi(k_s) v_s^T,  z = sum_s phi(k_s)   (s <= t where causal)
      = A v,  A = P / (rowsum(P) + Z_EPS),  P = mask(phi(q) phi(k)^T)

the function that `divide_by_z(fast_weight_attend(phi(q), phi(k), append_z_column(v)))` computes in its short
order (and, causal, chunked_sum over one chunk), as softmax attention computes its weights and then A v.
cpu/dpfp_attend.cpp forms phi of one head's queries and keys in a buffer that stays in cache and returns A and the
row sums; on a training batch the [B, H, T, 2 d nu] features, their gradients and the z column's passes cost the
plain composition more than the products (fw_fairseq/ops/README.md §12). Backward:

    dA = dy v^T,  dv = A^T dy,  then the kernel: dP = (dA - rowsum(dA * A)) / s,  dphi(q) = dP phi(k),
    dphi(k) = dP^T phi(q), and DPFP's backward of each row.

A padded key must read nothing: its raw key is zeroed, and DPFP(0) = 0 zeroes its column of P.
The kernel's products call BLAS where the loaded torch exports it, else its own loops (BLAS = False takes the
loops anyway: the tests run both).
"""
import torch

from .cpu_extension import cpu_kernel
from .guards import first_order, records
from .z_column import Z_EPS

BLAS = True


class DpfpSumRead(torch.autograd.Function):
    """y [B, H, Tq, M] = A v from q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M] (module docstring)."""

    @staticmethod
    def forward(ctx, q, k, v, nu, causal, kernel):
        weights, sums = kernel.dpfp_attend_forward(q, k, nu, causal, Z_EPS, BLAS)  # [B, H, Tq, T], [B, H, Tq]
        ctx.save_for_backward(q, k, v, weights, sums)
        ctx.nu, ctx.causal, ctx.kernel = nu, causal, kernel
        return weights @ v

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, weights, sums = ctx.saved_tensors
        dq = dk = dv = None
        if ctx.needs_input_grad[0] or ctx.needs_input_grad[1]:
            d_weights = grad @ v.transpose(-1, -2)  # [B, H, Tq, T]
            dq, dk = ctx.kernel.dpfp_attend_backward(d_weights, weights, sums, q, k, ctx.nu, ctx.causal, BLAS)
        if ctx.needs_input_grad[2]:
            dv = weights.transpose(-1, -2) @ grad  # [B, H, T, M]
        return dq, dk, dv, None, None, None


def dpfp_sum_read(q, k, v, nu, causal, key_padding_mask=None):
    """The sum rule's read y [B, H, Tq, M] with DPFP-nu features of raw heads q [B, H, Tq, d], k [B, H, T, d] and
    values v [B, H, T, M] (key_padding_mask [B, T], True at padding), on the CPU kernel; None where it does not run
    (not built, not a float32/float64 CPU tensor, torch.compile tracing, an empty sequence): the caller then forms phi
    and runs the rule. q, k and v share one dtype (the module's compute dtype)."""
    kernel = cpu_kernel(q)
    if not kernel or q.shape[2] == 0 or k.shape[2] == 0 or not q.dtype == k.dtype == v.dtype:
        return None
    if key_padding_mask is not None:
        k = k.masked_fill(key_padding_mask.bool()[:, None, :, None], 0.0)  # [B, 1, T, 1]: DPFP(0) = 0
    if records(q, k, v):
        return DpfpSumRead.apply(q, k, v, nu, causal, kernel)
    return kernel.dpfp_attend_forward(q, k, nu, causal, Z_EPS, BLAS)[0] @ v
