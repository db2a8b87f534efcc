"""Beam search over a cached source memory: one memory row per sentence, not per hypothesis.

fairseq's generator lays hypotheses out as [sentence, beam] on the batch dim. The source (and so
its fast-weight memory) is the same for a sentence's beams, so cross-attention writes it once per
sentence and keeps a hypothesis -> row map (`rows` [B]) beside it; these functions build, read and
reorder that pair. Memories are [rows, H, E, D]; queries head-first [B, H, T, E].
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


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
    memory [B / beam, H, E, D] -> [B, H, T, D], one read per sentence for all its beams."""
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
    """memory [R, H, E, D] and the reordered hypothesis -> row map `rows` [B] -> a memory whose
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
