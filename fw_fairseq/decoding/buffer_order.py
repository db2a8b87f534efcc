"""Beam search's reorders of a FastWeightAttention's decoder self-attention buffer in generation (decoder_state.py).

fairseq reorders the hypotheses before every step. The lazy cache and the state are not gathered then: the reorder
waits in the buffer (ORDER) for the next step, which reads the rows it names as it steps (decoder_state.lazy_step's
gather into spare storages, step_state). The raw step's kernel copies nothing even then: each hypothesis appends in
its own row of the cache's storages, and the lineage (LINEAGE) says which row holds each of its positions; a step
that reads the cache as rows of hypotheses settles it first (`settle`). With autograd everything is gathered at once.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from fw_fairseq.decoding.cache_storage import in_place, reorder, spare_name, target
from fw_fairseq.decoding.source_memory import regroup

# the decoder self-attention's buffer entries (name -> whether dim 2 counts positions): the lazy cache
# or the state, each with its reorder spare under spare_name(name)
ENTRIES = {"keys": True, "writes": True, "decay": True, "state": False}
CACHE = tuple(name for name, positions in ENTRIES.items() if positions)  # lazy_step's, in its order
# generation: beam search's reorder of the lazy cache or the state, not applied yet; the next step gathers
# the rows as it reads them (lazy_step's gather, step_state). A later reorder composes with it like any
# other row-indexed entry.
ORDER = "state_order"
# generation, after a reorder: lineage [B, t] int64, position s of hypothesis b is in row lineage[b, s] of the keys and
# writes storages (absent: row b), as the raw step's kernel left them. Every other step settles it first (`settle`).
LINEAGE = "lineage"


def reorder_decay(buffer: dict, order: Optional[Tensor]):
    """The decay (t values a head, scaled before a step reads them) in the hypotheses' order `order` (None: kept)."""
    if order is not None and buffer.get("decay") is not None:
        buffer["decay"], buffer[spare_name("decay")] = reorder(buffer["decay"], order, buffer.get(spare_name("decay")))


def gather(buffer: dict, order: Optional[Tensor]) -> Optional[Tuple[Tensor, Tensor, Tensor]]:
    """lazy_step's gather for beam search's reorder `order` left to this step (None: none): (order, the keys'
    and writes' targets); the decay is reordered here."""
    if order is None:
        return None
    reorder_decay(buffer, order)
    return (order, *(target(buffer[name], order.numel(), buffer.get(spare_name(name)), True)
                     for name in ("keys", "writes")))


def settle(buffer: dict):
    """The keys and writes [B, H, t, .] in the hypotheses' rows again, gathered through the lineage into their spares
    (a reorder left for the next step stays there): for the steps that read the rows as hypotheses, the fold."""
    lineage = buffer.pop(LINEAGE, None)  # [B, t]
    if lineage is None:
        return
    for name in ("keys", "writes"):
        cache = buffer[name]  # [B', H, t, .]
        out = target(cache, lineage.size(0), buffer.get(spare_name(name)), True)
        # [B, t] rows and [t] positions index dims 0 and 2: [B, t, H, .] -> [B, H, t, .]
        out.copy_(cache[lineage, :, torch.arange(cache.size(2))].transpose(1, 2))
        buffer[spare_name(name)], buffer[name] = cache, out


def reorder_buffer(buffer: dict, new_order: Tensor):
    """Beam search's reorder (and pruning) of a FastWeightAttention's buffer, in place: its rows `new_order` [B'] of
    every cached tensor (batch is dim 0 of each; integers, counts that all hypotheses share, stay). The decoder
    state's is left to the next step in generation (ORDER); the cached source (memory or keys and writes,
    source_memory.py) keeps one row per group of hypotheses that read the same row (a sentence's beams), copied only
    when such groups leave or split."""
    # fairseq reorders at every step, also when nothing moved (beam 1 while no sentence has
    # finished): the identity must not copy every cache and state
    spares = {spare_name(name) for name in ENTRIES}
    # the lineage's rows are the hypotheses (the storages' may be more): it and a reorder compose at the next step
    deferred = buffer.get(ORDER, buffer.get(LINEAGE))
    hypotheses = deferred.size(0) if deferred is not None else next(
        x.size(0) for name, x in buffer.items() if isinstance(x, Tensor) and name != "memory" and name not in spares)
    if new_order.numel() == hypotheses and torch.equal(new_order, torch.arange(hypotheses, device=new_order.device)):
        return
    memory, rows = buffer.get("memory"), buffer.get("memory_rows")
    for name, tensor in list(buffer.items()):
        if not isinstance(tensor, Tensor) or name in ("memory", LINEAGE) or name in spares:
            continue
        if name in ENTRIES and in_place():  # left to the next step (an ORDER already there composes below)
            buffer.setdefault(ORDER, new_order)
        elif name in ENTRIES:  # the decoder state: gathered into its spare storage (cache_storage.py)
            buffer[name], buffer[spare_name(name)] = reorder(tensor, new_order, buffer.get(spare_name(name)),
                                                             positions=ENTRIES[name])
        else:
            buffer[name] = tensor.index_select(0, new_order)
    # beam search mostly reorders hypotheses within their sentences: each still reads the same row
    if memory is not None and rows is not None and not torch.equal(buffer["memory_rows"], rows):
        beam = rows.numel() // memory.size(0)  # hypotheses per memory row before reordering
        buffer["memory"], buffer["memory_rows"] = regroup(memory, buffer["memory_rows"], beam)
