"""Softmax cross-attention with the aligned read's prior (a softmax cross-attention, --fw-cross-align P): the logit
of target position i over source position j gains log w(i, j) = 2P log cos((a_i - b_j) / 2), the window that the
aligned fast-weight cross-attention multiplies its scores by (cross_align.py: the same angles, the same
--fw-align-ratio). Softmax then weighs the source by w(i, j) exp(q_i . k_j): a baseline with the prior the fast
weights have, so that a comparison tells what the fast weights add beyond it. Decoding adds one [B, 1, S] bias a
step; the step's position is one count for all hypotheses (a beam search advances them together). Heads free of
the prior (--fw-align-free-heads) get no bias.
"""
from typing import Dict, Optional

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from fw_fairseq.modules.cross_align import aligned_angles
from fw_fairseq.modules.fast_weight_flags import cli_error

# The bias of a source position half a turn away (w = 0): a large finite logit offset, so that fp16 keeps it and a
# row never holds -inf where its source is not padded
FARTHEST = -1e4


def aligned_log_window(order: int, angles) -> Tensor:
    """log w(i, j) = 2P log cos((a_i - b_j) / 2) of angles (a [B, T], b [B, S]), at least FARTHEST -> [B, T, S]
    (float64)."""
    target, source = angles
    half = (target[:, :, None] - source[:, None, :]) / 2  # [B, T, S], in [-pi/2, pi/2]
    return (2 * order * torch.cos(half).clamp_min(1e-300).log()).clamp_min(FARTHEST)


class AlignedMultiheadAttention(MultiheadAttention):
    """fairseq's encoder-decoder attention with log w(i, j) added to its logits (fairseq's apply_sparse_mask hook,
    called on the logits [B * H, T, S] before the padding mask)."""

    def __init__(self, embed_dim, num_heads, order: int, ratio: float, free_heads: int = 0, **kwargs):
        super().__init__(embed_dim, num_heads, encoder_decoder_attention=True, **kwargs)
        self.align_order, self.align_ratio, self.align_free_heads = order, float(ratio), free_heads
        self._bias: Optional[Tensor] = None  # the forward's log window [B, 1 or H, T, S], for apply_sparse_mask

    @classmethod
    def like_fairseq(cls, layer, embed_dim, cfg, fw) -> "AlignedMultiheadAttention":
        """Built as fairseq's decoder layer builds its encoder attention (TransformerDecoderLayerBase), with the
        prior of the FastWeightConfig fw."""
        if cfg.encoder.xformers_att_config is not None:
            raise cli_error("argument --fw-cross-align: a softmax cross-attention with the prior computes its own "
                            "logits; allowed with --encoder-xformers-att-config: 0")
        return cls(embed_dim, cfg.decoder.attention_heads, fw.cross_align, fw.align_ratio, fw.align_free_heads,
                   kdim=cfg.encoder.embed_dim,
                   vdim=cfg.encoder.embed_dim, dropout=cfg.attention_dropout, q_noise=layer.quant_noise,
                   qn_block_size=layer.quant_noise_block_size)

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None, **kwargs):
        """query [T, B, C], key [S, B, C] (fairseq's layout); key_padding_mask [B, S] marks the source's padding."""
        tgt_len, bsz = query.shape[:2]
        src_len = key_padding_mask.size(1) if key_padding_mask is not None else key.size(0)
        positions = self._target_positions(incremental_state, tgt_len, query.device).expand(bsz, -1)  # [B, T]
        angles = aligned_angles(key_padding_mask, bsz, src_len, positions, self.align_ratio)
        bias = aligned_log_window(self.align_order, angles).to(query.dtype)[:, None]  # [B, 1, T, S]
        if self.align_free_heads:
            bias = bias.repeat(1, self.num_heads, 1, 1)  # [B, H, T, S]
            bias[:, self.num_heads - self.align_free_heads:] = 0.0
        self._bias = bias
        # static keys (the source, as fairseq's decoder passes them) also keep fairseq off torch's fused attention,
        # which would skip apply_sparse_mask
        kwargs["static_kv"] = True
        try:
            return super().forward(query, key, value, key_padding_mask=key_padding_mask,
                                   incremental_state=incremental_state, **kwargs)
        finally:
            self._bias = None

    def _target_positions(self, incremental_state, tgt_len: int, device) -> Tensor:
        """The positions [1, T] (float64) of this forward's target tokens: 0..T-1 teacher-forced; in decoding, the
        count of the steps before (kept in the incremental state, on the device: no synchronisation)."""
        steps = torch.arange(tgt_len, device=device, dtype=torch.float64)[None]  # [1, T]
        if incremental_state is None:
            return steps
        state = self.get_incremental_state(incremental_state, "align_step") or {}
        start = state.get("start")
        start = torch.zeros(1, 1, device=device, dtype=torch.float64) if start is None else start  # [1, 1]
        self.set_incremental_state(incremental_state, "align_step", {"start": start + tgt_len})
        return start + steps

    def apply_sparse_mask(self, attn_weights: Tensor, tgt_len: int, src_len: int, bsz: int) -> Tensor:
        """The logits [B * H, T, S] (queries' batch-major, as fairseq lays them out) plus the log window."""
        if self._bias is None:
            return attn_weights
        logits = attn_weights.view(bsz, self.num_heads, tgt_len, src_len) + self._bias
        return logits.view(bsz * self.num_heads, tgt_len, src_len)
