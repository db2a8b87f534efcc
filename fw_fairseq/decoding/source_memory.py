"""Beam search over a cached source memory: one memory row per sentence, not per hypothesis.

fairseq's generator lays hypotheses out as [sentence, beam] on the batch dim. The source (and so
its fast-weight memory) is the same for a sentence's beams, so cross-attention writes it once per
sentence and keeps a hypothesis -> row map (`rows` [B]) beside it; these functions build, read and
reorder that pair. Queries are head-first [B, H, T, E].

The cached source takes one of two forms, whichever a step reads fewer values of (`source_fits`):
- the memory W [rows, H, E, M] (M = D, or D + 1 with the sum rule's z column), o = phi(q) W;
- short sources: the keys' features and the effective writes side by side, [rows, H, S, E + M],
  o = (phi(q) phi(K)^T) U, the same function since W = sum_s phi(k_s)^T u_s, with U the rule's effective
  writes over the whole source (UpdateRule.writes: the sum rule's values, the delta rules' u_s of the
  sequential writes). Padded positions have zero value rows and their scalars at the rule's pad values:
  u_s = 0, they write nothing in either form. A rule without that form keeps the memory.
The cache form exists only for S < E M / (E + M) < E, so a tensor whose dim 2 is below E is one.
Rows are dim 0 of both forms, so the beam functions below serve both unchanged. A read whose kernel carries the
positions (ops/common/positions.py) caches, for short sources, the positional weight of every target position it can
tell apart beside its keys, or else the memory of the wider features (write_positioned_source,
read_weighted_source).
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from fw_fairseq.ops import fast_weight_read
from fw_fairseq.ops.common.positions import with_positions


def source_fits(length: int, d_phi: int, width: int) -> bool:
    """Whether a step over `length` source positions, reading length (d_phi + width) values per
    head, reads fewer than the [d_phi, width] memory."""
    return length * (d_phi + width) < d_phi * width


def write_source(rule, phi_k: Tensor, v: Tensor, *scalars: Tensor) -> Tensor:
    """The cached source of `rule` (an UpdateRule): the cache [B, H, S, E + M] when it reads fewer values than the
    memory and the rule has its effective writes, else the memory [B, H, E, M] (rule.write)."""
    if rule.writes is not None and source_fits(phi_k.size(2), phi_k.size(-1), v.size(-1)):
        return torch.cat([phi_k, rule.writes(phi_k, v, *scalars)], dim=-1)
    return rule.write(phi_k, v, *scalars)


def read_source(phi_q: Tensor, source: Tensor) -> Tensor:
    """phi_q [R, H, T, E] reads a cached source of either form -> [R, H, T, M]."""
    d_phi = phi_q.size(-1)
    if source.size(2) >= d_phi:
        return fast_weight_read(phi_q, source)
    phi_k, u = source.split([d_phi, source.size(-1) - d_phi], dim=-1)  # [R, H, S, E], [R, H, S, M]
    dtype = torch.promote_types(phi_q.dtype, source.dtype)
    return (phi_q.to(dtype) @ phi_k.transpose(-1, -2)) @ u  # [R, H, T, S] @ [R, H, S, M]


def positioned_fits(rule, length: int, d_phi: int, columns: int, rank: int, width: int) -> bool:
    """Whether a read whose kernel carries the positions caches a short source of `length` positions as phi(k), the
    weights of `columns` target positions and the rule's effective writes, [S, E + I + M] a head, which then holds
    fewer values than the memory of the `rank` times wider features [E R, M]."""
    return rule.writes is not None and length * (d_phi + columns + width) < d_phi * rank * width


def write_positioned_source(rule, phi_k: Tensor, factors: Tensor, weights: Optional[Tensor], v: Tensor,
                            *scalars: Tensor) -> Tensor:
    """The cached source of a read whose kernel carries the positions (ops/common/positions.py; the keys' factors h
    [B, S, R], or per head [B, H, S, R]): where the source is short (positioned_fits), [B, H, S, E + I + M], phi(k),
    `weights` [B, 1 or H, S, I] (w[j, i] = g(i) . h(j) for the I target positions a step may read as,
    read_weighted_source) and the rule's effective writes side by side; else (weights None) the memory of the R times
    wider features [B, H, E R, M]. A step then reads S (E + 1 + M) values instead of the memory's E R M and never
    forms g(i) or the wide features."""
    (bsz, heads, length, d_phi) = phi_k.shape
    wide = with_positions(phi_k, factors)  # [B, H, S, R E]
    if weights is None:
        return rule.write(wide, v, *scalars)
    u = rule.writes(wide if rule.key_reads else phi_k, v, *scalars)  # [B, H, S, M]
    return torch.cat([phi_k, weights.expand(bsz, heads, length, -1).to(phi_k.dtype), u], dim=-1)


def read_weighted_source(columns: int, first: int, steps: int, phi_q: Tensor, source: Tensor) -> Tensor:
    """phi_q [R, H, b T, E] (b hypotheses of T steps each, fairseq's beam layout, read_per_sentence) at target
    positions first .. first + T - 1, the last of `columns` weight columns standing for every later one, reads a
    cache of write_positioned_source -> [R, H, b T, M]: (phi(q) . phi(k)) w over the writes."""
    rows, heads, _, d_phi = phi_q.shape
    phi_k, w, u = source.split([d_phi, columns, source.size(-1) - d_phi - columns], dim=-1)
    if first + steps <= columns:
        w = w[..., first:first + steps]  # [R, H, S, T]
    else:  # past the last column a target position reads as the last one
        picked = torch.arange(first, first + steps, device=w.device).clamp(max=columns - 1)
        w = w.index_select(-1, picked)
    dtype = torch.promote_types(phi_q.dtype, source.dtype)
    scores = phi_q.to(dtype) @ phi_k.transpose(-1, -2)  # [R, H, b T, S]
    # [R, H, b T, S] -> [R, H, b, T, S], weighed by [R, H, 1, T, S]
    weighed = scores.view(rows, heads, -1, steps, phi_k.size(2)) * w.transpose(-1, -2)[:, :, None]
    return weighed.view_as(scores) @ u


def source_beam(key: Tensor, key_padding_mask: Optional[Tensor], beam: int) -> int:
    """`beam` if the source rows key [S, B, C] really repeat in groups of it, else 1.

    fairseq announces only beam sizes above 1, so after a beam-4 generator a beam-1 one (fairseq's
    hub interface) still announces 4: sharing must not rest on the claim."""
    if beam == 1 or key.size(1) % beam:
        return 1
    grouped = key.reshape(key.size(0), -1, beam, key.size(2))  # [S, B / beam, beam, C]
    same = torch.equal(grouped, grouped[:, :, :1].expand_as(grouped))
    if same and key_padding_mask is not None:
        masks = key_padding_mask.reshape(-1, beam, key_padding_mask.size(1))  # [B / beam, beam, S]
        same = torch.equal(masks, masks[:, :1].expand_as(masks))
    return beam if same else 1


def hypothesis_rows(memory: Tensor, beam: int) -> Tensor:
    """The row map of a memory written once per sentence: [0]*beam + [1]*beam + ... [B]."""
    return torch.arange(memory.size(0), device=memory.device).repeat_interleave(beam)


def read_per_sentence(read, phi_q: Tensor, memory: Tensor) -> Tensor:
    """Every hypothesis reads its sentence's row: read(q, memory) over phi_q [B, H, T, E] and
    memory [B / beam, H, ...] (either form) -> [B, H, T, D], one read per sentence for all its beams."""
    sentences, beam = memory.shape[0], phi_q.shape[0] // memory.shape[0]
    if beam == 1:
        return read(phi_q, memory)
    bsz, heads, length, width = phi_q.shape
    # [B, H, T, E] -> [B/beam, beam, H, T, E] -> [B/beam, H, beam*T, E]
    q = phi_q.view(sentences, beam, heads, length, width).transpose(1, 2)
    o = read(q.reshape(sentences, heads, beam * length, width), memory)  # [B/beam, H, beam*T, D]
    o = o.view(sentences, heads, beam, length, -1).transpose(1, 2)  # [B/beam, beam, H, T, D]
    return o.reshape(bsz, heads, length, -1)


def regroup(memory: Tensor, rows: Tensor, beam: int) -> Tuple[Tensor, Tensor]:
    """memory [R, H, ...] (either form) and the reordered hypothesis -> row map `rows` [B] -> a memory whose
    row i serves hypotheses i*beam .. (i+1)*beam-1, and its row map. The memory is copied only
    when groups leave or move; when a group's hypotheses point at different rows (an order that
    mixes sentences' beams), every hypothesis gets its own copy of its row."""
    if rows.numel() % beam == 0:
        groups = rows.view(-1, beam)  # [B / beam, beam]
        if torch.equal(groups, groups[:, :1].expand_as(groups)):
            heads = groups[:, 0]
            if not torch.equal(heads, torch.arange(memory.size(0), device=heads.device)):
                memory = memory.index_select(0, heads)  # sentences left (or moved)
            return memory, hypothesis_rows(memory, beam)
    return memory.index_select(0, rows), torch.arange(rows.numel(), device=rows.device)
