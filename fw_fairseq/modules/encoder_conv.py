"""--fw-encoder-conv: a depthwise convolution over the encoder self-attention's values, added to its read
(beyond the paper).

o_t = read_t + sum_{j=-K/2..K/2} w_j * v_{t+j} + b, per channel (C x K weights and C biases), over the
values of the same sentence, padded positions read as 0. The FLatten Transformer (Han et al. 2023) adds
it to linear attention for what the read of a memory lacks: its output has rank at most E per head and a
normalised read spreads over every position, where a translation encoder needs each word's neighbours.
Only the encoder: its self-attention sees the whole sentence, so the convolution needs no decoding
state; the decoder's causal fast weights already match softmax (results/compare_attention/where).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fw_fairseq.ops.common.guards import first_order


class DepthwiseConv(torch.autograd.Function):
    """o [S, B, C] = b + sum_j w[:, j] * v[t + j - K // 2], zero outside [0, S): v [S, B, C], w [C, K], b [C].

    nn.Conv1d computes the same in [B, C, S], but its permutes' copies and mkldnn's depthwise backward took
    2-3 times as long as the whole map on a CPU (a few ms a layer on a training batch); here it is K
    multiply-adds over shifted views each way, and K products summed for w's gradient.
    """

    @staticmethod
    def forward(ctx, v, w, b):
        S, K = v.shape[0], w.shape[1]
        vp = F.pad(v, (0, 0, 0, 0, K // 2, K // 2))  # [S + K - 1, B, C]: v_{t + j - K/2} is vp[t + j]
        o = torch.addcmul(b, vp[0:S], w[:, 0])
        for j in range(1, K):
            o.addcmul_(vp[j:j + S], w[:, j])
        ctx.save_for_backward(vp, w)
        return o

    @staticmethod
    @first_order  # its saved vp carries no graph to v: a second order would be silently wrong
    def backward(ctx, grad):
        vp, w = ctx.saved_tensors
        S, K = grad.shape[0], w.shape[1]
        h = K // 2
        dv = dw = db = None
        if ctx.needs_input_grad[0]:
            # v_s feeds o_{s - j + h} through w_j: dv_s = sum_j w_j g_{s - j + h} = sum_j w_j gp[s - j + 2h]
            gp = F.pad(grad, (0, 0, 0, 0, h, h))  # [S + K - 1, B, C]
            dv = gp[2 * h:2 * h + S] * w[:, 0]
            for j in range(1, K):
                dv.addcmul_(gp[2 * h - j:2 * h - j + S], w[:, j])
        if ctx.needs_input_grad[1]:
            # (einsum would permute both to a batched matmul and copy them)
            dw = torch.stack([(grad * vp[j:j + S]).sum((0, 1)) for j in range(K)], 1)  # [C, K]
        if ctx.needs_input_grad[2]:
            db = grad.sum((0, 1))
        return dv, dw, db


class EncoderConv(nn.Module):
    def __init__(self, embed_dim: int, width: int):
        super().__init__()  # width: odd, >= 3 (FastWeightConfig.check, fast_weight_flags.parse_encoder_conv)
        # nn.Conv1d's parameters ([C, 1, K] weights, [C] biases) and PyTorch's default initialisation, as in
        # FLatten: the sum starts away from the read alone
        self.conv = nn.Conv1d(embed_dim, embed_dim, width, padding=width // 2, groups=embed_dim)

    def forward(self, v: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """The convolution of the values v [S, B, C] (key_padding_mask [B, S], True at padding): [S, B, C]."""
        if key_padding_mask is not None:
            v = v.masked_fill(key_padding_mask.t()[..., None].bool(), 0.0)  # [B, S] -> [S, B, 1]
        w, b = self.conv.weight[:, 0].to(v.dtype), self.conv.bias.to(v.dtype)  # [C, K], [C]
        return DepthwiseConv.apply(v, w, b)
