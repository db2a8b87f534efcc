"""A FastWeightAttention's steps over its buffer in incremental decoding (generation, teacher-forced tests): the
decoder self-attention's over its lazy cache or state (decoder_state.py) and the cross-attention's over its cached
source (source_memory.py). Each entry chooses the backend of its step once (backend.py): on the kernels a step reads
the raw heads, phi formed inside the kernel; with PyTorch it forms phi first, the same function. Heads are
head-first [B, H, T, d]; every output is the read with the z column divided out, [B, H, T, D]."""
from typing import Optional, Tuple

from torch import Tensor

from fw_fairseq.decoding.backend import backend as backend_of
from fw_fairseq.decoding.cache_storage import in_place
from fw_fairseq.decoding.decoder_state import causal_step, lazy_capacity, raw_causal_step
from fw_fairseq.decoding.source_memory import hypothesis_rows, read_per_sentence, read_source, write_source


def self_attention_step(buffer: dict, block, q: Tensor, keys: Tensor, v: Tensor, scalars: Tuple[Tensor, ...],
                        key_padding_mask: Optional[Tensor]) -> Tensor:
    """The decoder self-attention of `block` (a Block) at positions q, keys, v [B, H, T, d] with the rule's scalars
    [B, H, T] each (at their pad values where key_padding_mask [B, T] is True), over its buffer (updated)."""
    past = buffer.get("keys")  # [B', H, t-1, C] while the lazy cache is live
    backend = backend_of(block, q, buffer.get("state") if past is None else past)
    positions = lazy_capacity(block, v.size(-1) + block.rule.z_column)
    # the raw step's kernel appends in place (no autograd) a whole position, z entry 1: a padded step's (z entry 0)
    # forms phi first
    if (backend.raw and in_place() and key_padding_mask is None and q.size(2) == 1 and "state" not in buffer
            and (0 if past is None else past.size(2)) < positions):
        return raw_causal_step(buffer, block, backend, q, keys, v, scalars, positions)
    phi_q, phi_k = block.features(q, is_query=True), block.features(keys, is_query=False)
    o = causal_step(buffer, block, backend, phi_q, phi_k, block.values(v, key_padding_mask), keys, scalars)
    return block.read_out(o)


def source_step(buffer: dict, block, q: Tensor, source: Optional[Tuple[Tensor, Tensor, Tuple[Tensor, ...]]],
                key_padding_mask: Optional[Tensor], beam: int) -> Tensor:
    """The cross-attention of `block` (a Block) from queries q [B, H, T, d]. The source is fixed, so it is written
    once per sentence, at the first step, from `source` (keys, v [B / beam, H, S, d] and the scalars [B / beam, H, S],
    one row per sentence of `beam` hypotheses; padded where key_padding_mask [B / beam, S] is True), and read by every
    step of every beam; None once it is cached. The buffer's "memory" holds the memory [B / beam, H, E, M] or, for
    short sources, its keys' features and effective writes [B / beam, H, S, E + M], whichever a step reads fewer
    values of (source_memory.py)."""
    memory = buffer.get("memory")
    backend = backend_of(block, q, memory)
    if memory is not None and backend.raw and q.size(2) == 1:
        return backend.source_read(block, q, memory)
    if memory is None:
        keys, v, scalars = source
        memory = write_source(block.rule, block.features(keys, is_query=False), block.values(v, key_padding_mask),
                              *scalars)
        buffer["memory"], buffer["memory_rows"] = memory, hypothesis_rows(memory, beam)
    return block.read_out(read_per_sentence(read_source, block.features(q, is_query=True), memory))
