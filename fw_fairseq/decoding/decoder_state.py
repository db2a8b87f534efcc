"""The lazy decoding state of causal fast-weight attention: the writes, not the state, while short.

A decoding step of the state form reads and writes the [E, M] fast weight whatever the output
length t. Until that pays, the decoder self-attention keeps instead what was written: the keys and
the effective writes u_s, the exact vectors added to the state:

    W_t = sum_{s<=t} c_s phi(k_s)^T u_s,        o_t = phi(q_t) W_t = sum_{s<=t} c_s (phi(q_t) . phi(k_s)) u_s

Each position's u_t is its rule's (UpdateRule.write_of) from its value and, where the rule's write reads the memory
at its key (UpdateRule.key_reads: the delta rules, u_t = beta_t (v_t - phi(k_t) W_{t-1})), the key's read of the
cache, which the lazy read scores beside the query's. The sum rule's u_t is v_t with its z column. c_s is the memory's
decay since position s (UpdateRule.decay_of: the gated rule's alpha_{s+1} ... alpha_t = gamma_t / gamma_s), kept as a
running product (multiplied by this step's factor before the step reads, 1 for the new position): no division by a
vanishing gamma_s, and W_{t-1} is decayed before the key reads it, as the rule's step reads alpha S.
Same functions as the rules' steps and loops; tests/ops/test_ops_lazy.py checks them in float64.

What is kept of a key is key_cache.py's choice per map (C wide: DPFP's raw d-wide key, the others' phi(k)), so a
step reads t (C + M) values; the state form reads E M, so the cache is folded into the state (`fold`) once
t (C + M) passes E M (`fits`) and decoding continues with the fixed-size step. Padded positions need no care: their
value rows (with the z column) and scalars are at the rule's pad values, so u_s = 0 and they write nothing.
Shapes head-first: phi_q, phi_k [B, H, 1, E], keys [B, H, t-1, C], writes [B, H, t-1, M],
decay [B, H, t-1], v [B, H, 1, M], scalars [B, H, 1] each.

Generation (no autograd) allocates nothing per step (cache_storage.py): the cached tensors are views of the first t
positions of storages of `capacity` positions, so a step writes one row in place (the kernel backend writes it as it
reads the cache) instead of copying the cache (a fresh [B H, t, C + M] tensor per step, which the CPU's allocator
also faults in page by page). Beam search's reorders wait for the next step (buffer_order.py): the state's step
gathers the rows while it reads them (`step_state`), the features step into a spare storage kept beside each tensor
(the two swap), and the raw step's kernel copies no row at all (its lineage). With autograd (teacher-forced tests of
the gradients) the same functions concatenate. Which backend steps (kernels or PyTorch) is backend.py's choice, made
once at the step's entry (steps.py).
"""
from typing import Optional, Tuple

from torch import Tensor

from fw_fairseq.decoding.backend import TORCH, lazy_read
from fw_fairseq.decoding.buffer_order import CACHE, LINEAGE, ORDER, gather as _gather, reorder_decay, settle
from fw_fairseq.decoding.cache_storage import append, grown, in_place, spare_name, started, target
from fw_fairseq.decoding.key_cache import FEATURES


def fits(length: int, d_phi: int, width: int, key_width: Optional[int] = None) -> bool:
    """Whether a step over `length` cached positions, reading length (key_width + width) values
    (key_width: the cached key's, d_phi unless given), reads no more than the [d_phi, width] state it
    replaces."""
    return length * ((key_width or d_phi) + width) <= d_phi * width


def capacity(d_phi: int, width: int, key_width: Optional[int] = None) -> int:
    """The most positions a cache holds before it is folded: the largest length that `fits`."""
    return d_phi * width // ((key_width or d_phi) + width)


def lazy_capacity(block, width: int) -> int:
    """The most positions the lazy cache of `block` (a Block) holds with writes `width` wide; 0 for a rule without
    a lazy write (UpdateRule.write_of None), which keeps its state from the first step."""
    return 0 if block.rule.write_of is None else capacity(block.phi.out_dim, width, block.keys.width)


def step_state(backend, rule, q: Tensor, k: Tensor, v: Tensor, scalars: Tuple[Tensor, ...], state: Tensor,
               order: Optional[Tensor], spare: Optional[Tensor]) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Generation's step of the folded state [B', H, E, M], continuing its rows `order` [B] (a deferred
    reorder; None: in place): -> (o [B, H, 1, M], the new state [B, H, E, M], the next spare)."""
    state = state.contiguous()  # a rule's causal form may leave a view; the step writes one storage it reads
    if order is None:
        return backend.state_step(rule, q, k, v, scalars, state, None, None), state, spare
    out = target(state, order.numel(), spare, positions=False)
    return backend.state_step(rule, q, k, v, scalars, state, order, out), out, state


def lazy_step(rule, phi_q: Tensor, phi_k: Tensor, v: Tensor, keys: Optional[Tensor], writes: Optional[Tensor],
              decay: Optional[Tensor], *scalars: Tensor, cache=FEATURES, key: Optional[Tensor] = None,
              norm: Optional[str] = None, gather: Optional[Tuple[Tensor, Tensor, Tensor]] = None,
              backend=TORCH) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """One decoding step of `rule` (an UpdateRule) from the past positions' keys and writes (None before the first),
    with the rule's scalars. cache: what the cache keeps of a key (key_cache.py; FEATURES: phi_k itself), `key` this
    step's row [B, H, 1, C] (None: phi_k), and `norm` (None: none) the normalisation that makes phi_k of
    cache.features(key): the cache keeps the write as cache.kept_write says. gather (generation): (order [B], keys_out,
    writes_out), beam search's reorder left to this step: the hypotheses continue rows `order` of keys and writes
    [B', H, t-1, .], gathered into the outs (their views in spare storages) by the backend's step; decay is already
    in the hypotheses' order. backend: the one chosen at the step's entry (backend.py).
    Returns (o [B, H, 1, M], keys [B, H, t, C], writes [B, H, t, M], decay [B, H, t] or None without decay)."""
    factor = rule.decay_of(*scalars)  # [B, H, 1] or None
    decay = _decayed(decay, factor)
    key = phi_k if key is None else key
    positions = capacity(phi_k.size(-1), v.size(-1), key.size(-1))  # folded before it outgrows this
    if writes is None or not in_place():  # the first position, or autograd: concatenations
        o, u = lazy_read(rule, cache, phi_q, phi_k, v, keys, writes, decay, scalars)
        keys, writes = append(keys, key, positions), append(writes, cache.kept_write(u, key, norm), positions)
    else:  # generation: the step's rows go into views of t positions, in place or in the spares
        order, outs = _outs(gather, keys, writes, positions)
        o = backend.lazy_step(rule, cache, phi_q, phi_k, v, scalars, keys, writes, decay, order, outs, key, norm)
        keys, writes = outs
    return o, keys, writes, _with_new_position(decay, factor, positions)


def _outs(gather, keys: Tensor, writes: Tensor, positions: int) -> Tuple[Optional[Tensor], Tuple[Tensor, Tensor]]:
    """Generation: (the reorder left to this step or None, the views of t positions [B, H, t, .] that take the rows
    read and, at position t-1 (unwritten), the step's own): in the gather's targets, else in the caches' storages."""
    order, keys_out, writes_out = gather or (None, keys, writes)
    return order, (grown(keys_out, positions), grown(writes_out, positions))


def _decayed(decay: Optional[Tensor], factor: Optional[Tensor]) -> Optional[Tensor]:
    """The decays of the cached positions [B, H, t-1] times this step's factor [B, H, 1]: c_s = gamma_t / gamma_s
    (in place without autograd: append's room). Unchanged without either."""
    if decay is None or factor is None:
        return decay
    return decay.mul_(factor) if in_place() else decay * factor


def _with_new_position(decay: Optional[Tensor], factor: Optional[Tensor], positions: int) -> Optional[Tensor]:
    """The decays [B, H, t] with this position's 1 (not decayed yet) after them; None for a rule without decay."""
    if factor is None:
        return None
    # [B, H, 1, 1] rows for append's dim 2
    return append(None if decay is None else decay[..., None], factor.new_ones(factor.shape)[..., None],
                  positions)[..., 0]


def fold(keys: Tensor, writes: Tensor, decay: Optional[Tensor], cache=FEATURES) -> Tensor:
    """The state of the cached positions, W = sum_s c_s phi(k_s)^T u_s: keys [B, H, t, C] as `cache` keeps them
    (FEATURES: the features themselves, C = E), writes [B, H, t, M], decay [B, H, t] or None -> [B, H, E, M]."""
    phi_k = cache.features(keys)  # [B, H, t, E]
    if decay is not None:
        phi_k = phi_k * decay[..., None]  # [B, H, t, E]
    return phi_k.transpose(-1, -2) @ writes


def _keep(buffer: dict, gather, keys: Tensor, writes: Tensor, decay: Optional[Tensor]):
    """The buffer after a lazy step: its new keys, writes and decay; after a gather, the storages read are the
    next reorder's spares."""
    if gather is not None:
        buffer[spare_name("keys")], buffer[spare_name("writes")] = buffer["keys"], buffer["writes"]
    buffer["keys"], buffer["writes"] = keys, writes
    if decay is not None:
        buffer["decay"] = decay


def raw_causal_step(buffer: dict, block, backend, q: Tensor, k: Tensor, v: Tensor, scalars: Tuple[Tensor, ...],
                    positions: int) -> Tensor:
    """Generation's lazy step of `block` from the raw heads q, k [B, H, 1, d] on the kernel backend's raw step (phi,
    its normalisation and the sum rule's z column in the kernel): causal_step's o [B, H, 1, D] with the z column
    divided out, the buffer updated as causal_step updates it. While the cache holds fewer than `positions`
    (lazy_capacity) and no state (steps.py decides)."""
    past = buffer.get("keys")  # [B', H, t-1, C]: rows of hypotheses, or with a lineage the storages' (B' >= B)
    if past is None:  # the first position: empty views of new storages, which the kernel's step starts
        past = buffer["keys"] = started(q, (block.keys.width,), positions)  # [B, H, 0, C]
        buffer["writes"] = started(q, (v.size(-1) + block.rule.z_column,), positions)  # [B, H, 0, M]
    order = buffer.pop(ORDER, None)
    reorder_decay(buffer, order)
    factor = block.rule.decay_of(*scalars)
    decay = _decayed(buffer.get("decay"), factor)
    # in the storages themselves, which the kernel's views of t positions [B', H, t, .] take: a reorder (or an earlier
    # one's lineage) makes its step traced
    lineage, writes = buffer.pop(LINEAGE, None), buffer["writes"]  # [B, t-1] or None
    o, after, *outs = backend.raw_step(block, q, k, v, scalars, past, writes, decay, order, lineage)
    if o is None:  # storages without room for position t-1: the same rows in storages with room (`grown`) first
        past, writes = (grown(x, positions)[:, :, :-1] for x in (past, writes))
        o, after, *outs = backend.raw_step(block, q, k, v, scalars, past, writes, decay, order, lineage)
    buffer["keys"], buffer["writes"] = outs
    decay = _with_new_position(decay, factor, positions)
    if decay is not None:
        buffer["decay"] = decay
    if after is not None:  # [B, t]
        buffer[LINEAGE] = after
    return o


def causal_step(buffer: dict, block, backend, phi_q: Tensor, phi_k: Tensor, v: Tensor, keys: Tensor,
                scalars: Tuple[Tensor, ...]) -> Tensor:
    """The decoder self-attention of one layer in incremental decoding, over its buffer (updated): the lazy
    cache ("keys", "writes", "decay") while a step over it reads fewer values than the [E, M] state, then
    the state ("state"). block: the layer's Block; backend: the step's (backend.py). phi_q [B, H, T, E]; the
    written positions' phi_k [B, H, T, E], v [B, H, T, M], keys [B, H, T, d], scalars [B, H, T] each.
    Returns o [B, H, T, M]."""
    settle(buffer)
    rule, past = block.rule, buffer.get("keys")  # [B, H, t-1, C] while the cache is live
    length = phi_q.size(2) + (0 if past is None else past.size(2))
    order = buffer.pop(ORDER, None)  # a reorder left for this step (generation)
    if (phi_q.size(2) == 1 and "state" not in buffer and rule.write_of is not None
            and fits(length, phi_q.size(-1), v.size(-1), block.keys.width)):
        gather = _gather(buffer, order)
        o, *cache = lazy_step(rule, phi_q, phi_k, v, past, buffer.get("writes"), buffer.get("decay"), *scalars,
                              cache=block.keys, key=block.keys.row(keys, phi_k), norm=block.norm, gather=gather,
                              backend=backend)
        _keep(buffer, gather, *cache)
        return o
    # the cache (if any) and its spares leave the buffer, folded once into the state
    cache = []
    for name in CACHE:
        buffer.pop(spare_name(name), None)
        cache.append(buffer.pop(name, None))
    if order is not None and cache[0] is not None:  # the reorder, applied before the fold
        cache = [None if x is None else x.index_select(0, order) for x in cache]
        order = None
    state = buffer.get("state", None if cache[0] is None else fold(*cache, block.keys))
    if phi_q.size(2) == 1 and state is not None and in_place() and rule.in_place_step is not None:
        # generation: the state is this layer's own, stepped in place or into its spare
        o, buffer["state"], spare = step_state(backend, rule, phi_q, phi_k, v, scalars, state, order,
                                               buffer.pop(spare_name("state"), None))
        if spare is not None:
            buffer[spare_name("state")] = spare
        return o
    state = state if order is None else state.index_select(0, order)
    o, buffer["state"] = rule.causal(phi_q, phi_k, v, *scalars, initial_state=state, output_final_state=True)
    return o
