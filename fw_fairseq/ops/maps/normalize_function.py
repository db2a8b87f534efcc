"""phi / n(phi) over the last dim with a hand-written backward, for both of --fw-delta-norm's norms.

    sum: n = max(sum phi, eps)      l2: n = max(||phi||_2, eps)      y = phi / n

Autograd's backward of the plain formula walks the E-wide tensors about ten times (the division's two
gradients, the norm's, the clamp's mask): on a CPU two of them cost more than a DPFP-2 delta layer's
chunked rule. Written out, with y = phi / n and an unclamped n:

    sum: dphi = (g - (y . g)) / n          l2: dphi = (g - y (y . g)) / n

and where n was clamped at eps, n is a constant: dphi = g / eps. Three passes over E-wide tensors.
First order only (guards.first_order); while torch.compile traces, sum_normalize and l2_normalize below
use the plain formula, which it fuses by itself.
"""
import torch

from fw_fairseq.ops.common.guards import eager_form, first_order

PHI_EPS = 1e-6  # the normalisations' floor: phi / max(norm, PHI_EPS)


def norm_of(x, kind):
    """The unclamped norm of `kind` ("sum" or "l2") over the last dim, kept: [..., 1]."""
    if kind == "sum":
        return x.sum(dim=-1, keepdim=True)
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True)


def plain_normalize(x, kind, eps):
    """x / max(norm_of(x, kind), eps) as plain ops: the formula NormalizeFunction writes out."""
    return x / norm_of(x, kind).clamp_min(eps)


def normalize_saving(x, kind, eps):
    """y = x / max(norm_of(x, kind), eps) and what its backward needs: (y, (y, clamped norm, unclamped mask))."""
    norm = norm_of(x, kind)  # [..., 1]
    clamped = norm.clamp_min(eps)
    y = x / clamped
    return y, (y, clamped, norm > eps)


def normalize_backward(grad, saved, kind):
    """The gradient of x from the gradient of y (normalize_saving's saved tensors)."""
    y, clamped, unclamped = saved
    # (y . g), zero where the norm was clamped: there the division was by the constant eps
    dot = torch.linalg.vecdot(y, grad).unsqueeze(-1).mul_(unclamped)  # [..., 1]
    if kind == "sum":
        dx = grad - dot
    else:
        dx = torch.addcmul(grad, y, dot, value=-1)
    return dx.div_(clamped)


class NormalizeFunction(torch.autograd.Function):
    """y = x / max(norm_of(x, kind), eps), x [..., E] -> y [..., E]."""

    @staticmethod
    def forward(ctx, x, kind, eps):
        y, saved = normalize_saving(x, kind, eps)
        ctx.save_for_backward(*saved)
        ctx.kind = kind
        return y

    @staticmethod
    @first_order
    def backward(ctx, grad):
        return normalize_backward(grad, ctx.saved_tensors, ctx.kind), None, None


def sum_normalize(x, eps=PHI_EPS):
    """phi'(x) = phi(x) / sum(phi(x)) over the last dim (paper §4.2), for non-negative x.

    The denominator is clamped from below at eps (not eps added): the result is exactly
    normalised whenever the sum exceeds eps, and an all-zero row (a padded position) gives 0,
    never NaN, with a finite gradient.
    """
    return _normalize(x, "sum", eps)


def l2_normalize(x, eps=PHI_EPS):
    """phi'(x) = phi(x) / ||phi(x)||_2 over the last dim (DeltaNet, Yang et al. 2024).

    A unit key makes the delta write an exact overwrite at beta = 1 (phi(k)^T W' = v), where a
    sum-normalised key (||phi(k)||_2 <= 1, about E^-1/2 when phi is spread out) only moves the
    stored value a fraction ||phi(k)||^2 of the way. Clamped like sum_normalize: 0 stays 0.
    """
    return _normalize(x, "l2", eps)


def _normalize(x, kind, eps):
    """x / max(norm_of(x, kind), eps) (normalize_function.py's forms)."""
    return eager_form(NormalizeFunction, plain_normalize, plain_normalize, x, kind, eps)


def phi_scale(x, kind, eps=PHI_EPS):
    """The factor [..., 1] by which --fw-delta-norm's `kind` normalisation multiplies x [..., E]:
    1 / max(norm_of(x, kind), eps), as sum_normalize and l2_normalize divide."""
    return norm_of(x, kind).clamp_min(eps).reciprocal()


# --fw-delta-norm: how the delta rules normalise phi of keys and queries (the sum rule divides by z)
PHI_NORMS = {"sum": sum_normalize, "l2": l2_normalize}
