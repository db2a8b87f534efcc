"""Generation's storage of the decoder self-attention's cached tensors (decoder_state.py): no allocation per step.

The lazy cache's tensors are views of the first t positions of storages of `capacity` positions, so a step writes
one row in place (`grown`, `append`) instead of copying the cache (a fresh [B H, t, C + M] tensor per step, which the
CPU's allocator also faults in page by page); a beam reorder gathers into a spare storage kept beside each tensor and
the two swap (`target`, `reorder`). With autograd (teacher-forced tests of the gradients) the same functions
concatenate and index.
"""
import math
from typing import Optional, Tuple

import torch
from torch import Tensor


def in_place() -> bool:
    """Whether the decoding state is written in place: in generation, where nothing is differentiated
    (fairseq-generate runs under no_grad); with autograd every step makes new tensors."""
    return not torch.is_grad_enabled()


def spare_name(name: str) -> str:
    return f"{name}_spare"


def room(cache: Tensor) -> int:
    """How many positions the storage under cache [B, H, t, ...] holds from its start on dim 2:
    cap when it is the [:, :, :t] view of a [B' >= B, H, cap, ...] storage, else t."""
    B, H, t, *rest = cache.shape  # one call for the shape and one for the strides: a decoding step pays for each
    s0, s1, s2, *_ = cache.stride()
    row = max(math.prod(rest), 1)
    cap = s1 // row
    laid_out = (s2 == row and s1 == cap * row and s0 == H * s1 and cache.storage_offset() == 0
                and cache.untyped_storage().nbytes() >= B * s0 * cache.element_size())
    return cap if laid_out and cap >= t else t


def grown(cache: Tensor, positions: int) -> Tensor:
    """Generation: cache [B, H, t, ...] -> the view of its first t + 1 positions (position t not written), in
    its own storage when that has room, else in a new one of max(positions, 2 (t + 1)) positions."""
    B, H, t, *rest = cache.shape
    if room(cache) <= t:
        storage = cache.new_empty((B, H, max(positions, 2 * (t + 1)), *rest))
        storage[:, :, :t] = cache
        cache = storage[:, :, :t]
    return cache.as_strided((B, H, t + 1, *rest), cache.stride())


def started(like: Tensor, rest: Tuple[int, ...], positions: int) -> Tensor:
    """An empty cache [B, H, 0, *rest] (B, H and dtype those of like) in a new storage of max(positions, 2) positions,
    which `grown` then fills from its start."""
    return like.new_empty((*like.shape[:2], max(positions, 2), *rest))[:, :, :0]


def append(cache: Optional[Tensor], row: Tensor, positions: int) -> Tensor:
    """cache [B, H, t, ...] (None: t = 0) with row [B, H, 1, ...] after it -> [B, H, t + 1, ...].

    Without autograd the row is written in place when the cache's storage has room, else into a new
    storage of max(positions, 2 (t + 1)) positions (`grown`); with autograd it is a concatenation."""
    if not in_place():
        return row if cache is None else torch.cat([cache, row], dim=2)
    if cache is None:
        cache = started(row, row.shape[3:], positions)
    longer = grown(cache, positions)
    longer[:, :, -1:] = row
    return longer


def target(cache: Tensor, rows: int, spare: Optional[Tensor], positions: bool) -> Tensor:
    """Where `rows` rows gathered from cache [B, H, t, ...] go: into `spare` (the storage the previous
    reorder left free) when it has room for them (and, with `positions`, for the t positions of a lazy
    cache's dim 2; the state has none), else into a new storage with the cache's room."""
    t = cache.size(2)
    if spare is not None and spare.size(0) >= rows and spare.shape[1] == cache.shape[1] and (
            spare.shape[3:] == cache.shape[3:] and (room(spare) >= t if positions else spare.size(2) == t)):
        return spare.as_strided((rows, *cache.shape[1:]), spare.stride())
    held = room(cache) if positions else t  # the first reorder, or more rows than the spare has
    return cache.new_empty((rows, cache.size(1), held, *cache.shape[3:])).narrow(2, 0, t)


def reorder(cache: Tensor, order: Tensor, spare: Optional[Tensor], positions: bool = True
            ) -> Tuple[Tensor, Optional[Tensor]]:
    """Beam search's rows `order` [B'] of cache [B, H, ...] -> (the reordered cache, the next spare).

    Without autograd the rows are gathered into a spare storage (`target`); the old cache's storage
    is then the spare. With autograd: index_select, and no spare."""
    if not in_place():
        return cache.index_select(0, order), None
    out = target(cache, order.numel(), spare, positions)
    return torch.index_select(cache, 0, order, out=out), cache
