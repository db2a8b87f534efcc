"""The sum rule's normalisation through a z column: the values carry a ones column, so the memory's last
column is z = sum_t phi(k_t), and a read [numerator; z . phi(q)] is divided out.

`divide_by_z` has a hand-written backward where autograd records: autograd's of the slice-and-divide walked
the [..., D + 1] reads about eight times (the two quotients' gradients, a negation, a zero-filled tensor
for each slice's backward and the copies into it); written out it is two passes:

    y = n / s, s = z + Z_EPS:   dn = g / s,   dz = -(g . y) / s
"""
import torch

from fw_fairseq.ops.common.guards import first_order, hand_written_backward

Z_EPS = 1e-6  # the guard of the z column's denominator: y = W^T phi(q) / (z . phi(q) + Z_EPS)


def append_z_column(v, key_padding_mask=None):
    """[B, H, T, D] -> [B, H, T, D + 1]: the ones column whose memory column is z = sum_t phi(k_t), 0 at the padded
    positions of key_padding_mask [B, T] (True at padding), which must write nothing into z."""
    ones = v.new_ones(v.shape[:-1] + (1,))  # [B, H, T, 1]
    if key_padding_mask is not None:
        ones = ones.masked_fill(key_padding_mask.bool()[:, None, :, None], 0.0)
    return torch.cat([v, ones], dim=-1)


class DivideByZ(torch.autograd.Function):
    """y [..., D] = o[..., :D] / (o[..., D] + Z_EPS) of a read o [..., D + 1]."""

    @staticmethod
    def forward(ctx, o):
        s = o[..., -1:] + Z_EPS  # [..., 1]
        y = o[..., :-1] / s
        ctx.save_for_backward(y, s)
        return y

    @staticmethod
    @first_order
    def backward(ctx, grad):
        y, s = ctx.saved_tensors
        d_o = grad.new_empty(*y.shape[:-1], y.shape[-1] + 1)  # [..., D + 1]
        torch.div(grad, s, out=d_o[..., :-1])
        d_o[..., -1] = torch.linalg.vecdot(grad, y).div_(s[..., 0]).neg_()
        return d_o


def divide_by_z(o):
    """[..., D + 1] read through a z-column memory -> y = numerator / (z . phi(q) + Z_EPS) [..., D]."""
    if hand_written_backward(o):
        return DivideByZ.apply(o)
    return o[..., :-1] / (o[..., -1:] + Z_EPS)
