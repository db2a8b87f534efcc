"""FAVOR+ with a hand-written backward: the same function as favor_plus (the plain maths, below), in fewer passes
(and `orthogonal_gaussian`, the draw of its projection R).

With x' = x d^-1/4, u = x' R^T [..., m], h = |x'|^2 / 2 and e = [u - h, -u - h] [..., 2m]:

    phi = exp(e - c) / sqrt(2m),   c = max_j e_j for queries (then phi <= 1), c = 0 for keys.

Autograd of the formula as written walks the 2m-wide tensors once per op (the concatenation, two
subtractions, the negation, the shift, exp, the scale; in backward each again, plus amax's mask): on a
CPU the map cost more than a DPFP-2 map and the sum rule together. Written out, with de = dphi * phi
(d exp = exp) and the shift's gradient put on the row's maximum:

    de_total = de - [j = argmax] sum(de)  (queries),   de_total = de  (keys);
    du = de_total[:m] - de_total[m:];   dh = -sum(de_total);   dx = (du R + dh x') d^-1/4.

For a query sum(de_total) = 0, so dh = 0: the shift cancels |x'|^2 / 2 exactly. R is a buffer (redrawn,
never trained): it gets no gradient. Where a query's maximum is tied, the shift's gradient goes to one
of the tied entries (torch.max's index), where autograd's amax splits it among them; either is a valid
gradient of the same function (at a tie max is not differentiable), and the module's output, which
divides by z . phi(q) or normalises phi(q), does not depend on c at all.
First order only (guards.first_order); while torch.compile traces, FavorPlus uses the plain formula.
"""
import math

import torch

from fw_fairseq.ops.common.guards import first_order


def favor_forward(x, projection, is_query):
    """FAVOR+ of x [..., d] with R = projection [m, d], without autograd: (phi [..., 2m], x' [..., d],
    the index of each query row's maximum [..., 1] or None)."""
    d, m = x.shape[-1], projection.shape[0]
    xs = x * d ** -0.25  # [..., d]
    u = xs @ projection.T  # [..., m]
    half_sq_norm = 0.5 * torch.linalg.vecdot(xs, xs).unsqueeze(-1)  # [..., 1]
    e = u.new_empty(*u.shape[:-1], 2 * m)  # [..., 2m]
    torch.sub(u, half_sq_norm, out=e[..., :m])
    torch.add(u, half_sq_norm, out=e[..., m:]).neg_()
    argmax = None
    if is_query:
        shift, argmax = e.max(dim=-1, keepdim=True)  # [..., 1]
        e.sub_(shift)
    return e.exp_().mul_(1.0 / math.sqrt(2 * m)), xs, argmax


class FavorFunction(torch.autograd.Function):
    """phi [..., 2m] = FAVOR+ of x [..., d] with the random projection R [m, d] (no gradient)."""

    @staticmethod
    def forward(ctx, x, projection, is_query):
        phi, xs, argmax = favor_forward(x, projection, is_query)
        ctx.save_for_backward(phi, xs, projection, argmax)
        return phi

    @staticmethod
    @first_order
    def backward(ctx, grad):
        phi, xs, projection, argmax = ctx.saved_tensors
        m, d = projection.shape
        de = grad * phi  # [..., 2m]
        if argmax is not None:
            de.scatter_add_(-1, argmax, -de.sum(dim=-1, keepdim=True))  # the shift's gradient
        du = de[..., :m] - de[..., m:]  # [..., m]
        dx = du @ projection  # [..., d]
        if argmax is None:  # keys: dh = -sum(de); a query's is 0
            dx.addcmul_(xs, de.sum(dim=-1, keepdim=True), value=-1)
        return dx.mul_(d ** -0.25), None, None


def orthogonal_gaussian(rows, cols, device, dtype):
    """[rows, cols] block-orthogonal Gaussian matrix as in the Performer (Choromanski et al., 2021).

    Each block of `cols` rows is the orthonormal Q of a Gaussian matrix; row norms are then
    replaced by norms of independent Gaussian vectors so that each row is marginally N(0, I)
    (unbiased softmax-kernel estimate) while rows within a block stay orthogonal (lower variance).
    """
    blocks = []
    for start in range(0, rows, cols):
        gaussian = torch.randn(cols, cols, device=device, dtype=torch.float32)
        q, _ = torch.linalg.qr(gaussian)  # [cols, cols], orthonormal columns
        blocks.append(q.T[: rows - start])  # orthonormal rows
    directions = torch.cat(blocks, dim=0)  # [rows, cols]
    norms = torch.randn(rows, cols, device=device, dtype=torch.float32).norm(dim=1, keepdim=True)  # [rows, 1]
    return (norms * directions).to(dtype)


def favor_plus(x, projection, is_query):
    """FAVOR+ of x [..., d] with R = projection [m, d] (FavorPlus's maths): [..., 2m]."""
    d, m = x.shape[-1], projection.shape[0]
    x = x * d ** -0.25  # [..., d]
    u = x @ projection.T  # [..., m]
    half_sq_norm = 0.5 * (x * x).sum(dim=-1, keepdim=True)  # [..., 1]
    exponents = torch.cat([u - half_sq_norm, -u - half_sq_norm], dim=-1)  # [..., 2m]
    if is_query:
        # A per-query factor exp(-c) cancels exactly downstream: the sum rule divides by
        # z . phi(q) and the delta rule normalises phi(q). Subtracting the row max keeps
        # exp <= 1 however large |q| is.
        exponents = exponents - exponents.amax(dim=-1, keepdim=True)
    # Keys get no per-row shift: a per-key factor would reweight that key's value in the sum
    # and change the function. They are bounded anyway: r.x - |x|^2/2 = |r|^2/2 - |x - r|^2/2
    # <= |r_i|^2/2 for every row r_i of R (and likewise for -r_i). |r_i|^2 ~ chi^2(d), about d,
    # so the exponent stays near d/2 = 32 for d = 64, far below float32's exp limit (~88).
    return torch.exp(exponents) / math.sqrt(2 * m)
