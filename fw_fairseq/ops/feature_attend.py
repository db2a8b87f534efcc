"""A short sequence's read from the raw heads, on the CPU kernels (cpu/feature_attend.cpp, cpu/delta_attend.cpp), for
the maps with a row form there (cpu_extension.KERNEL_MAPS: DPFP-nu, ELU+1, Hedgehog, FAVOR+).

A short sequence reads in the order (q k^T) v: its products of features are [T, T] per head, where forming phi
writes [B, H, T, E] tensors that, with their gradients, cost the plain composition more than the products on a
training batch (fw_fairseq/ops/README.md §12). The kernel forms phi of one head's queries and keys in a buffer that
stays in cache and returns only the products; the same functions as the rules' ops over phi, for two rules:

- sum (fast_weight_attend's short order, or chunked_sum over one chunk where causal), through the z column:
      y = W^T phi(q) / (z . phi(q) + Z_EPS) = A v,   A = P / (rowsum(P) + Z_EPS),   P = mask(phi(q) phi(k)^T)
  as softmax attention computes its weights and then A v. Backward: dA = dy v^T, dv = A^T dy, and in the kernel
  dP = (dA - rowsum(dA * A)) / s. A padded key reads nothing: the kernel sets its row of phi to 0 (its dk is 0).
- delta, causal (one chunk of chunked_delta, README §2 with no state) or not (fast_weight_attend's short order:
  every query reads the memory after the last write), phi normalised (--fw-delta-norm):
      P = phi(q) phi(k)^T (tril where causal),  X = tril(phi(k) phi(k)^T, -1),  (I + diag(beta) X) U = diag(beta) V,
      O = P U
  all of it in the kernel (cpu/delta_attend.cpp: U by forward substitution, its backward by back substitution),
  which returns O and keeps U for the backward.
Then dphi(q) = dP phi(k), dphi(k) = dP^T phi(q) (+ (dX + dX^T) phi(k)) and the map's backward, in the kernel.
Its products call BLAS where the loaded torch exports it, else its own loops (BLAS = False takes the loops anyway:
the tests run both). It reads the heads in their own layout (the module's are views of [T, B, C]) and writes dq and dk
in it. First order only (guards.first_order).
"""
import torch

from .chunked import DELTA_ONE_CHUNK_MAX, SUM_CHUNK_SIZE
from .cpu_extension import KERNEL_MAPS, KERNEL_NORMS, cpu_kernel
from .guards import first_order, records
from .normalize_function import PHI_EPS
from .read_order import short_order
from .z_column import Z_EPS

BLAS = True


class SumRead(torch.autograd.Function):
    """y [B, H, Tq, M] = A v from q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M] (module docstring); map: the
    kernel's (code, nu, projection)."""

    @staticmethod
    def forward(ctx, q, k, v, pad, map, causal, kernel):
        weights, sums = kernel.feature_attend_forward(q, k, pad, *map, causal, Z_EPS, BLAS)  # [B,H,Tq,T], [B,H,Tq]
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
                                                        ctx.causal, Z_EPS, BLAS)
        if ctx.needs_input_grad[2]:
            dv = weights.transpose(-1, -2) @ grad  # [B, H, T, M]
        return dq, dk, dv, None, None, None, None


class DeltaRead(torch.autograd.Function):
    """O [B, H, Tq, M] of the delta rule from q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M], beta [B, H, T]
    (module docstring); map: the kernel's (code, nu, projection); norm: KERNEL_NORMS' code."""

    @staticmethod
    def forward(ctx, q, k, v, beta, map, causal, norm, kernel):
        out, writes = kernel.delta_attend_forward(q, k, v, beta, *map, causal, norm, PHI_EPS, BLAS)  # O, U
        ctx.save_for_backward(q, k, v, beta, writes, map[2])
        ctx.map, ctx.causal, ctx.norm, ctx.kernel = map[:2], causal, norm, kernel
        return out

    @staticmethod
    @first_order
    def backward(ctx, grad):
        q, k, v, beta, writes, projection = ctx.saved_tensors
        dq, dk, dv, dbeta = ctx.kernel.delta_attend_backward(grad, writes, q, k, v, beta, *ctx.map, projection,
                                                             ctx.causal, ctx.norm, PHI_EPS, BLAS)
        return dq, dk, dv, dbeta, None, None, None, None


def sum_short_read(kernel, map, width, q, k, v, scalars, causal, norm, key_padding_mask):
    """The sum rule's short read (its record's `short`)."""
    Tq, T = q.shape[2], k.shape[2]
    if not (T <= SUM_CHUNK_SIZE if causal else short_order(Tq, T, width, v.shape[-1] + 1)):
        return None  # the rule forms the memory (or chunks) instead: the kernel has no cheaper order there
    # the kernel sets the features of padded keys to 0: their columns of P are 0
    if records(q, k, v):
        return SumRead.apply(q, k, v, key_padding_mask, map, causal, kernel)
    return kernel.feature_attend_forward(q, k, key_padding_mask, *map, causal, Z_EPS, BLAS)[0] @ v


def delta_short_read(kernel, map, width, q, k, v, scalars, causal, norm, key_padding_mask):
    """The delta rule's short read (its record's `short`)."""
    Tq, T = q.shape[2], k.shape[2]
    # several chunks carry a state (the chunked form); a non-causal read in the memory's order forms the memory
    if T > DELTA_ONE_CHUNK_MAX or not (causal or short_order(Tq, T, width, v.shape[-1])):
        return None
    code, beta = KERNEL_NORMS[norm], scalars[0]  # beta [B, H, T]: 0 at padded positions (their v rows too)
    if records(q, k, v, beta):
        return DeltaRead.apply(q, k, v, beta, map, causal, code, kernel)
    return kernel.delta_attend_forward(q, k, v, beta, *map, causal, code, PHI_EPS, BLAS)[0]


def short_read(map_name, nu, width, rule, q, k, v, scalars, causal, norm, key_padding_mask=None, projection=None):
    """The read y [B, H, Tq, M] of rule `rule` (a rules.UpdateRule; its record's `short` runs it) with the features of map `map_name` (a KERNEL_MAPS
    name; nu: DPFP's, else ignored; projection: FAVOR+'s R [m, d], else None; width: its E) of raw heads
    q [B, H, Tq, d] and k [B, H, T, d], values v [B, H, T, M] (0 at padded positions) and the rule's scalars
    ([B, H, T] each, at their pad values there), phi normalised by `norm` where the rule normalises it;
    key_padding_mask [B, T], True at padding. The sum rule's read is divided by its z
    column. None where it does not run: a rule or order without a read here, no kernel (not built, not
    float32/float64 CPU tensors, torch.compile tracing), an empty sequence, or mixed dtypes; the caller then forms
    phi and runs the rule, the same function."""
    kernel = cpu_kernel(q)
    if (not kernel or rule.short is None or q.shape[2] == 0 or k.shape[2] == 0
            or any(x.dtype != q.dtype for x in (k, v, *scalars))):
        return None
    if projection is not None:
        projection = projection.to(q.dtype)  # a float32 buffer; the kernel computes in q's dtype
    return rule.short(kernel, (KERNEL_MAPS[map_name], nu, projection), width, q, k, v, scalars, causal, norm,
                        key_padding_mask)
