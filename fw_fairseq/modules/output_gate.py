"""--fw-output-gate: the read of a fast-weight block, gated before the output projection (beyond the paper).

y_t -> sigmoid(W_g x_t + b_g) * y_t, with x_t the query's input: the block can shut what the memory
returned for a position, which a read normalised by z . phi(q) cannot do itself (Gated Linear Attention,
Yang et al. 2024; Gated DeltaNet; Qiu et al. 2025 for softmax attention). `channel` learns one gate per
channel (C x C weights), `head` one per head shared by its d_key channels (C x H: nearly free at decoding).

`rms` gates nothing: it divides each head's read by its root mean square and multiplies by a learned weight per
channel (DeltaNet's output norm, Yang et al. 2024). The delta rule with sum-normalised phi writes β ‖φ(k)‖² of
each difference, so over a message its state, and the read's size, grow with the number of writes: a count of the
position that runs past anything seen in training on longer messages. The norm leaves the read's direction only.
"""
import torch
from torch import Tensor, nn

OUTPUT_GATES = ("none", "channel", "head", "rms")
RMS_EPS = 1e-6  # added to the mean square: a read of zero (nothing written yet) stays finite


class OutputGate(nn.Module):
    def __init__(self, kind: str, embed_dim: int, num_heads: int):
        super().__init__()
        if kind not in OUTPUT_GATES[1:]:
            raise ValueError(f"--fw-output-gate got {kind!r}; allowed: {OUTPUT_GATES}")
        self.kind, self.head_dim = kind, embed_dim // num_heads
        if kind == "rms":
            self.weight = nn.Parameter(torch.ones(embed_dim))
            return
        self.proj = nn.Linear(embed_dim, embed_dim if kind == "channel" else num_heads)
        # bias 0: every gate starts around 1/2, as the projections' xavier draw spreads it
        nn.init.xavier_uniform_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def extra_repr(self):
        return f"kind={self.kind}"

    def forward(self, x: Tensor, read: Tensor) -> Tensor:
        """The read [T, B, C] gated by the query's input x [T, B, C] (or normalised per head): [T, B, C]."""
        if self.kind == "rms":
            return self._rms(read)
        gate = torch.sigmoid(self.proj(x))  # [T, B, C] or [T, B, H]
        if self.kind == "channel":
            return read * gate
        length, bsz, channels = read.shape
        # [T, B, C] -> [T, B, H, D]: each head's gate broadcast over its channels, in the heads' channel order
        heads = read.view(length, bsz, -1, self.head_dim) * gate[..., None]
        return heads.view(length, bsz, channels)

    def _rms(self, read: Tensor) -> Tensor:
        length, bsz, channels = read.shape
        # [T, B, C] -> [T, B, H, D]: the mean square per head, in fp32 under --fp16 (a half read's squares overflow)
        heads = read.view(length, bsz, -1, self.head_dim)
        heads = heads.to(torch.promote_types(heads.dtype, torch.float32))
        heads = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return (heads.view(length, bsz, channels) * self.weight).to(read.dtype)
