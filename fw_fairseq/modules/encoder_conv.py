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

from torch import Tensor, nn


class EncoderConv(nn.Module):
    def __init__(self, embed_dim: int, width: int):
        super().__init__()  # width: odd, >= 3 (FastWeightConfig.check, fast_weight_flags.parse_encoder_conv)
        # PyTorch's default initialisation, as in FLatten: the sum starts away from the read alone
        self.conv = nn.Conv1d(embed_dim, embed_dim, width, padding=width // 2, groups=embed_dim)

    def forward(self, v: Tensor, key_padding_mask: Optional[Tensor]) -> Tensor:
        """The convolution of the values v [S, B, C] (key_padding_mask [B, S], True at padding): [S, B, C]."""
        if key_padding_mask is not None:
            v = v.masked_fill(key_padding_mask.t()[..., None].bool(), 0.0)  # [B, S] -> [S, B, 1]
        return self.conv(v.permute(1, 2, 0)).permute(2, 0, 1)  # [S, B, C] -> [B, C, S] -> back
