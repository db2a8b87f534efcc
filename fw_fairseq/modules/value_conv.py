"""Depthwise convolutions over a self-attention's values, added to its read (beyond the paper).

--fw-encoder-conv K (EncoderConv): o_t = read_t + sum_{j=-K/2..K/2} w_j * v_{t+j} + b, per channel (C x K weights and
C biases), over the values of the same sentence, padded positions read as 0. The FLatten Transformer (Han et al.
2023) adds it to linear attention for what the read of a memory lacks: its output has rank at most E per head and a
normalised read spreads over every position, where a translation encoder needs each word's neighbours.

--fw-decoder-conv K (DecoderConv): the same over the decoder self-attention's own position and the K - 1 before it,
o_t = read_t + sum_{j=0..K-1} w_j * v_{t-j} + b, so that it stays causal. The decoder's read of its own past is an
average too: a token repeated after itself reads almost what the first one read, where softmax's read can land on
the previous position. The convolution gives each position the last K values as they are. Generation keeps the
last K - 1 values of every hypothesis (`conv_tail` in the layer's buffer, batch first, so beam search's reorder
moves it with the rest).
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fw_fairseq.ops.common.guards import first_order


class DepthwiseConv(torch.autograd.Function):
    """o [S, B, C] = b + sum_j w[:, j] * v[t + j - left], zero outside [0, S): v [S, B, C], w [C, K], b [C];
    `left` = K // 2 centres the window on t, `left` = K - 1 ends it at t (causal).

    nn.Conv1d computes the same in [B, C, S], but its permutes' copies and mkldnn's depthwise backward took
    2-3 times as long as the whole map on a CPU (a few ms a layer on a training batch); here it is K
    multiply-adds over shifted views each way, and K products summed for w's gradient.
    """

    @staticmethod
    def forward(ctx, v, w, b, left):
        S, K = v.shape[0], w.shape[1]
        vp = F.pad(v, (0, 0, 0, 0, left, K - 1 - left))  # [S + K - 1, B, C]: v_{t + j - left} is vp[t + j]
        o = torch.addcmul(b, vp[0:S], w[:, 0])
        for j in range(1, K):
            o.addcmul_(vp[j:j + S], w[:, j])
        ctx.save_for_backward(vp, w)
        ctx.left = left
        return o

    @staticmethod
    @first_order  # its saved vp carries no graph to v: a second order would be silently wrong
    def backward(ctx, grad):
        vp, w = ctx.saved_tensors
        S, K = grad.shape[0], w.shape[1]
        dv = dw = db = None
        if ctx.needs_input_grad[0]:
            # v_s feeds o_{s - j + left} through w_j: dv_s = sum_j w_j g_{s - j + left} = sum_j w_j gp[s + K - 1 - j]
            gp = F.pad(grad, (0, 0, 0, 0, K - 1 - ctx.left, ctx.left))  # [S + K - 1, B, C]
            dv = gp[K - 1:K - 1 + S] * w[:, 0]
            for j in range(1, K):
                dv.addcmul_(gp[K - 1 - j:K - 1 - j + S], w[:, j])
        if ctx.needs_input_grad[1]:
            # (einsum would permute both to a batched matmul and copy them)
            dw = torch.stack([(grad * vp[j:j + S]).sum((0, 1)) for j in range(K)], 1)  # [C, K]
        if ctx.needs_input_grad[2]:
            db = grad.sum((0, 1))
        return dv, dw, db, None


class ValueConv(nn.Module):
    """nn.Conv1d's parameters ([C, 1, K] weights, [C] biases) and PyTorch's default initialisation, as in FLatten:
    the sum starts away from the read alone. The parameter names (`conv.weight`, `conv.bias`) are the checkpoints'."""

    def __init__(self, embed_dim: int, width: int, left: int):
        super().__init__()
        self.conv = nn.Conv1d(embed_dim, embed_dim, width, groups=embed_dim)
        self.left = left  # the window's positions before t: K // 2 (centred) or K - 1 (causal)

    def forward(self, v: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """The convolution of the values v [S, B, C] (key_padding_mask [B, S], True at padding): [S, B, C]."""
        return DepthwiseConv.apply(self.padded_as_zeros(v, key_padding_mask), *self.weights(v.dtype), self.left)

    @staticmethod
    def padded_as_zeros(v: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """v [S, B, C] with the positions key_padding_mask [B, S] marks (True at padding) set to zero."""
        if key_padding_mask is None:
            return v
        return v.masked_fill(key_padding_mask.t()[..., None].bool(), 0.0)  # [B, S] -> [S, B, 1]

    def weights(self, dtype: torch.dtype):
        """w [C, K] and b [C] in dtype."""
        return self.conv.weight[:, 0].to(dtype), self.conv.bias.to(dtype)


class EncoderConv(ValueConv):
    def __init__(self, embed_dim: int, width: int):
        # width: odd, >= 3 (fast_weight_flags.parse_encoder_conv)
        super().__init__(embed_dim, width, width // 2)


class DecoderConv(ValueConv):
    def __init__(self, embed_dim: int, width: int):
        super().__init__(embed_dim, width, width - 1)  # width >= 1 (--fw-decoder-conv)

    def step(self, buffer: Dict[str, Optional[Tensor]], v: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """Generation: the convolution of new values v [T, B, C] (one step: T = 1; key_padding_mask [B, T], True at
        padding, whose values count as zeros as in forward) after those the buffer kept; keeps the last K - 1 in
        buffer["conv_tail"] [B, K - 1, C], zeros before the first step (the sentence's start)."""
        K = self.conv.weight.shape[-1]
        v = self.padded_as_zeros(v, key_padding_mask)
        tail = buffer.get("conv_tail")
        if tail is None:
            tail = v.new_zeros(v.shape[1], K - 1, v.shape[2])
        seq = torch.cat([tail.transpose(0, 1), v])  # [K - 1 + T, B, C]: v_{t - j} is seq[K - 1 + t - j]
        buffer["conv_tail"] = seq[seq.shape[0] - (K - 1):].transpose(0, 1)  # [B, K - 1, C]
        # the causal convolution of the kept values and the new ones; its first K - 1 rows belong to earlier steps
        return DepthwiseConv.apply(seq, *self.weights(v.dtype), K - 1)[K - 1:]  # [T, B, C]
