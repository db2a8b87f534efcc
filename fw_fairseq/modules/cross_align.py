"""Aligned cross-attention (--fw-cross-align P): the fast-weight read of the source weighted towards the source
position that the target position aligns with, as a kernel that stays a fast weight memory.

Target position i and source position j (0-based, of a source of N tokens) get the angles a_i = pi min(i / r, N) / N
and b_j = pi j / N (r: --fw-align-ratio, the target's length over the source's), and the read of q_i weighs the write of k_j by phi(q_i) . phi(k_j) w(i, j) with
    w(i, j) = cos^(2P)((a_i - b_j) / 2) in [0, 1]:
1 on the diagonal, 0 between the first and the last position, narrower as P grows (P = 1: 1/2 at half a source
apart; P = 4: 1/16). Because (2 cos(x / 2))^(2P) = sum_{k=-P..P} C(2P, P+k) e^(ikx), w is a sum of 2P + 1
products of a function of i and one of j, so the weighted kernel is phi'(q_i) . phi'(k_j), features (2P + 1) times
wider:
phi'(x) = phi(x) (x) [sqrt(C(2P, P)), sqrt(2 C(2P, P+k)) cos(k a), sqrt(2 C(2P, P+k)) sin(k a) for k = 1..P] / 2^P,
which keeps ||phi'(x)|| = ||phi(x)|| (the binomial weights sum to 4^P): an L2-normalised phi stays normalised for
a delta rule over the source. A source is written once and read at every step as before. Training hands the
factors to the rule's read (UpdateRule.attend's positions): its short order weighs the scores by w and never forms
the wide phi', and the fused GPU read (the rule's fused_aligned) forms w on chip from the angles. Generation caches,
for a short source, w of every target position it tells apart beside its keys, else the memory of phi'
(source_memory.py). A target position past the source's length aligns with its last token (the end-of-sentence
marker). A softmax cross-attention adds log w to its logits instead (aligned_softmax.py). With --fw-align-free-heads
F the last F heads read without the prior: their factors are (1, 0, ..., 0), so w = 1 for them and the read of every
head keeps one width.
"""
import math
from functools import partial
from typing import Optional

import torch
from torch import Tensor

from fw_fairseq.decoding.source_memory import (hypothesis_rows, positioned_fits, read_per_sentence,
                                                read_weighted_source, write_positioned_source)
from fw_fairseq.ops import fast_weight_read
from fw_fairseq.ops.common.positions import position_weight, with_positions
from fw_fairseq.ops.fused_read.dispatch import fused_aligned_read_for


def align_factors(angle: Tensor, order: int) -> Tensor:
    """The positional factors g of positions of angles angle [B, T] -> [B, T, 2 order + 1]: g(a) . g(b) = w, with
    the binomial weights over 4^P, so that phi (x) g keeps the norm of phi."""
    angle = angle[..., None]  # [B, T, 1]
    parts = [torch.full_like(angle, math.sqrt(math.comb(2 * order, order) / 4 ** order))]
    for k in range(1, order + 1):
        scale = math.sqrt(2 * math.comb(2 * order, order + k) / 4 ** order)
        parts += [scale * torch.cos(k * angle), scale * torch.sin(k * angle)]
    return torch.cat(parts, dim=-1)


def free_head_factors(factors: Tensor, heads: int, free: int) -> Tensor:
    """Positional factors [B, T, R] of every head -> per head [B, H, T, R], the last `free` heads' (1, 0, ..., 0):
    g . h = 1 there, the plain read; [B, T, R] as it is where no head is free."""
    if free == 0:
        return factors
    factors = factors[:, None].repeat(1, heads, 1, 1)  # [B, H, T, R]
    factors[:, heads - free:] = 0.0
    factors[:, heads - free:, :, 0] = 1.0
    return factors


def source_lengths(key_padding_mask: Optional[Tensor], batch: int, length: int, device) -> Tensor:
    """The source's tokens per sentence [B] (float): its unpadded positions."""
    if key_padding_mask is None:
        return torch.full((batch,), float(length), device=device, dtype=torch.float64)
    return (~key_padding_mask.bool()).sum(1).to(torch.float64)


def source_angles(key_padding_mask: Optional[Tensor], lengths: Tensor, length: int) -> Tensor:
    """b_j = pi j / N of the source's positions [B, S] (N: lengths [B], source_lengths); fairseq pads a source on
    either side, so j counts the unpadded positions before it (a padded position's angle is that of a neighbour; it
    writes nothing)."""
    if key_padding_mask is None:
        j = torch.arange(length, device=lengths.device, dtype=torch.float64).expand(lengths.size(0), length)
    else:
        j = ((~key_padding_mask.bool()).cumsum(1) - 1).clamp(min=0).to(torch.float64)  # [B, S]
    return math.pi * j / lengths[:, None]


def target_angles(positions: Tensor, lengths: Tensor, ratio: float) -> Tensor:
    """a_i = pi min(i / r, N) / N of target positions [B, T] (float) over source lengths [B], for a target r times
    as long as its source -> [B, T]."""
    return math.pi * torch.minimum(positions / ratio, lengths[:, None]) / lengths[:, None]


def aligned_angles(key_padding_mask: Optional[Tensor], batch: int, src_len: int, positions: Tensor,
                   ratio: float):
    """The angles of target positions [B, T] (float64) and of the source's positions: [B, T], [B, S]."""
    lengths = source_lengths(key_padding_mask, batch, src_len, positions.device)
    return target_angles(positions, lengths, ratio), source_angles(key_padding_mask, lengths, src_len)


def aligned_read(block, order: int, ratio: float, q: Tensor, keys: Tensor, v: Tensor, scalars,
                 key_padding_mask: Optional[Tensor], dtype: torch.dtype, free: int = 0) -> Tensor:
    """Training and validation: queries q [B, H, T, d] at target positions 0..T-1 read the aligned source written by
    keys, v [B, H, S, d] -> [B, H, T, D], the last `free` heads without the prior. The heads are raw, half where the
    fused GPU read may take them (fused_read/dispatch.py: it weighs the scores on chip, every head alike); every
    other path computes in dtype."""
    bsz, heads, src_len, _ = keys.shape
    target = torch.arange(q.size(2), device=q.device, dtype=torch.float64).expand(bsz, -1)  # [B, T]
    angles = aligned_angles(key_padding_mask, bsz, src_len, target, ratio)  # [B, T], [B, S]
    o = None if free else fused_aligned_read_for(block.phi, block.rule, order, angles, q, keys, v, key_padding_mask)
    if o is not None:
        return o
    q, keys, v = (x.to(dtype) for x in (q, keys, v))
    # [B, T, R], [B, S, R]; per head [B, H, T, R], [B, H, S, R]
    factors = tuple(free_head_factors(align_factors(angle, order), heads, free) for angle in angles)
    return block.read_out(block.rule.attend(block.features(q, is_query=True), block.features(keys, is_query=False),
                                            block.values(v, key_padding_mask), *scalars, positions=factors))


def weight_columns(src_len: int, ratio: float) -> int:
    """Target positions 0 .. I - 1 whose aligned weights differ: from position I - 1 = ceil(r S) on, i / r >= S >= N
    and every target position aims at the source's last token."""
    return math.ceil(ratio * src_len) + 1


def write_aligned_source(buffer: dict, block, order: int, ratio: float, source, key_padding_mask: Optional[Tensor],
                         beam: int, hypotheses: int, free: int):
    """Generation's first step: the aligned source written from `source` (keys, v [B / beam, H, S, d], scalars), one
    row per sentence of `beam` hypotheses, with the weights of its target positions beside it where it is short
    (source_memory.write_positioned_source); a memory keeps each hypothesis's source length ([B], reordered with
    the hypotheses) for the target factors of later steps."""
    keys, v, scalars = source
    rows, heads, src_len, _ = keys.shape
    lengths = source_lengths(key_padding_mask, rows, src_len, keys.device)  # [B / beam]
    # [B / beam, S, R] (per head: [B / beam, H, S, R])
    factors = free_head_factors(align_factors(source_angles(key_padding_mask, lengths, src_len), order), heads, free)
    phi_k, values = block.features(keys, is_query=False), block.values(v, key_padding_mask)
    columns = weight_columns(src_len, ratio)
    weights = None  # the memory: no target position's weights are formed
    if positioned_fits(block.rule, src_len, phi_k.size(-1), columns, factors.size(-1), values.size(-1)):
        target = torch.arange(columns, device=keys.device, dtype=torch.float64).expand(rows, -1)  # [B / beam, I]
        # [B / beam, I, R] (per head: [B / beam, H, I, R])
        targets = free_head_factors(align_factors(target_angles(target, lengths, ratio), order), heads, free)
        weights = position_weight(factors, targets)  # [B / beam, 1 or H, S, I]
    memory = write_positioned_source(block.rule, phi_k, factors, weights, values, *scalars)
    buffer["memory"], buffer["memory_rows"] = memory, hypothesis_rows(memory, beam)
    buffer["align_step"], buffer["align_columns"] = 0, columns
    if weights is None:  # the memory [B / beam, H, E R, M]: later steps form the targets' factors
        buffer["align_lengths"] = lengths.repeat_interleave(hypotheses // rows)  # [B]


def aligned_step(buffer: dict, block, order: int, ratio: float, q: Tensor, source,
                 key_padding_mask: Optional[Tensor], beam: int, free: int = 0) -> Tensor:
    """Generation: the aligned source written once, at the first step, from `source` (write_aligned_source), and read
    by queries q [B, H, T, d] at the next T target positions of each hypothesis (fairseq steps them all alike), the
    last `free` heads without the prior."""
    if buffer.get("memory") is None:
        write_aligned_source(buffer, block, order, ratio, source, key_padding_mask, beam, q.size(0), free)
    first, steps = buffer["align_step"], q.size(2)
    buffer["align_step"] = first + steps
    phi_q = block.features(q, is_query=True)  # [B, H, T, E]
    if "align_lengths" not in buffer:  # the short form: the weights of these positions are cached
        read = partial(read_weighted_source, buffer["align_columns"], first, steps)
        return block.read_out(read_per_sentence(read, phi_q, buffer["memory"]))
    positions = torch.arange(first, first + steps, device=q.device, dtype=torch.float64).expand(q.size(0), -1)
    factors = align_factors(target_angles(positions, buffer["align_lengths"], ratio), order)  # [B, T, R]
    wide = with_positions(phi_q, free_head_factors(factors, q.size(1), free))  # [B, H, T, R E]
    return block.read_out(read_per_sentence(fast_weight_read, wide, buffer["memory"]))
