"""The lazy decoding state of causal fast-weight attention: the writes, not the state, while short.

A decoding step of the state form reads and writes the [E, M] fast weight whatever the output
length t. Until that pays, the decoder self-attention keeps instead what was written: the keys and
the effective writes u_s, the exact vectors added to the state:

    W_t = sum_{s<=t} c_s phi(k_s)^T u_s,        o_t = phi(q_t) W_t = sum_{s<=t} c_s (phi(q_t) . phi(k_s)) u_s

- sum rule: u_s = [v_s; 1] (the z column), c_s = 1;
- delta rule: u_t = beta_t (v_t - phi(k_t) W_{t-1}) = beta_t (v_t - sum_{s<t} c_s (phi(k_t) . phi(k_s)) u_s);
- gated delta: as the delta rule with the decays c_s = alpha_{s+1} ... alpha_t (gamma_t / gamma_s),
  kept as a running product (multiplied by alpha_t at each step, 1 for the new position): no
  division by a vanishing gamma_s. With W_{t-1} decayed by alpha_t first, u_t is step.py's
  u = beta (v - alpha k S).
Same functions as ops.step / ops.naive; tests/ops/test_ops_lazy.py checks them in float64.

What is kept of a key is the feature map's choice (FeatureMap.cache_row; `phi` below, None for the
features themselves): DPFP keeps the raw d-wide key and its CPU kernel forms phi in registers while it
scores (its 2 d nu wide features cost a step more to read than to recompute), so a step reads t (d + M)
values, as many as softmax's t 2d. Where phi of the keys is normalised (the delta rules), phi(k_s) =
scale_s phi_raw(k_s), and the cache keeps the writes times scale_s: the products are the same.
A step reads t (C + M) values (C: the cached key's width) and the state form E M, so the module folds
the writes into the state (`fold`) once t (C + M) passes E M (`fits`) and continues with the
fixed-size step. Padded positions need no care: their value rows (with the z column) and their beta are
zero, so u_s = 0 and they write nothing.
Shapes head-first: phi_q, phi_k [B, H, 1, E], keys [B, H, t-1, C], writes [B, H, t-1, M],
decay [B, H, t-1], v [B, H, 1, M], beta, alpha [B, H, 1].

Generation (no autograd) allocates nothing per step (cache_storage.py): the cached tensors are
views of the first t positions of storages of `capacity` positions, so a step writes one row in place
(the map's kernel writes it as it reads the cache: FeatureMap.cached_step) instead of copying the cache (a fresh [B H, t, C + M] tensor per step, which the CPU's allocator also
faults in page by page). Beam search's reorders wait for the next step (buffer_order.py): the state's
step gathers the rows while it reads them (`step_state`), the features step into a spare storage kept
beside each tensor (the two swap), and the raw step's kernel copies no row at all (its lineage). With
autograd (teacher-forced tests of the gradients) the same functions concatenate.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from fw_fairseq.modules.buffer_order import CACHE, LINEAGE, ORDER, gather as _gather, reorder_decay, settle
from fw_fairseq.modules.cache_storage import append, grown, in_place, spare_name, started, target
from fw_fairseq.ops import phi_scale
from fw_fairseq.ops.step import step_in_place


def fits(length: int, d_phi: int, width: int, key_width: Optional[int] = None) -> bool:
    """Whether a step over `length` cached positions, reading length (key_width + width) values
    (key_width: the cached key's, d_phi unless given), reads no more than the [d_phi, width] state it
    replaces."""
    return length * ((key_width or d_phi) + width) <= d_phi * width


def capacity(d_phi: int, width: int, key_width: Optional[int] = None) -> int:
    """The most positions a cache holds before it is folded: the largest length that `fits`."""
    return d_phi * width // ((key_width or d_phi) + width)


def step_state(q: Tensor, k: Tensor, v: Tensor, beta: Optional[Tensor], alpha: Optional[Tensor], state: Tensor,
               order: Optional[Tensor], spare: Optional[Tensor]) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    """Generation's step of the folded state [B', H, E, M], continuing its rows `order` [B] (a deferred
    reorder; None: in place): -> (o [B, H, 1, M], the new state [B, H, E, M], the next spare)."""
    if order is None:
        return step_in_place(q, k, v, beta, alpha, state), state, spare
    out = target(state, order.numel(), spare, positions=False)
    return step_in_place(q, k, v, beta, alpha, state, order, out), out, state


def lazy_step(phi_q: Tensor, phi_k: Tensor, v: Tensor, keys: Optional[Tensor], writes: Optional[Tensor],
              decay: Optional[Tensor], beta: Optional[Tensor] = None, alpha: Optional[Tensor] = None,
              phi=None, key: Optional[Tensor] = None, norm: Optional[str] = None,
              gather: Optional[Tuple[Tensor, Tensor, Tensor]] = None) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """One decoding step from the past positions' keys and writes (None before the first).

    beta None: the sum rule (u_t = v_t, the caller's v carries the z column); beta given: the
    delta rule, gated by alpha if given. phi None: the cache keeps phi(k) itself; else the FeatureMap
    whose rows it keeps, `key` this step's row [B, H, 1, C], and `norm` (None: none) the normalisation that
    makes phi_k of phi.cached_features(key): the cache keeps the write u times its factor. gather
    (generation): (order [B], keys_out, writes_out), beam search's reorder left to this step: the
    hypotheses continue rows `order` of keys and writes [B', H, t-1, .], gathered into the outs (their views
    in spare storages) while the step reads them where the map has a fused step (FeatureMap.cached_step),
    else first; decay is already in the hypotheses' order.
    Returns (o [B, H, 1, M], keys [B, H, t, C], writes [B, H, t, M], decay [B, H, t] for the gated rule
    else None)."""
    decay = _decayed(decay, alpha)
    key = phi_k if key is None else key
    positions = capacity(phi_k.size(-1), v.size(-1), key.size(-1))  # folded before it outgrows this
    if writes is None or not in_place():  # the first position, or autograd: concatenations
        o, u = _read(phi_q, phi_k, v, keys, writes, decay, beta, phi)
        keys, writes = append(keys, key, positions), append(writes, _scaled(u, phi, key, phi_k, norm), positions)
    else:  # generation: the step's rows go into views of t positions, in place or in the spares
        order, outs = _outs(gather, keys, writes, positions)
        # the map's fused step reads the cache and appends this position's row in one call
        fused = None if phi is None else phi.cached_step(phi_q, phi_k, v, beta, keys, writes, decay, order, outs,
                                                          key, norm)
        if fused is None:
            past = tuple(x[:, :, :-1] for x in outs)  # [B, H, t-1, .]
            if gather is not None:  # no fused step to gather the rows as it reads them
                for cache, out in zip((keys, writes), past):
                    torch.index_select(cache, 0, order, out=out)
            o, u = _read(phi_q, phi_k, v, *past, decay, beta, phi)
            outs[0][:, :, -1:] = key
            outs[1][:, :, -1:] = _scaled(u, phi, key, phi_k, norm)
        else:
            o = fused[0]
        keys, writes = outs
    return o, keys, writes, _with_new_position(decay, alpha, positions)


def _outs(gather, keys: Tensor, writes: Tensor, positions: int) -> Tuple[Optional[Tensor], Tuple[Tensor, Tensor]]:
    """Generation: (the reorder left to this step or None, the views of t positions [B, H, t, .] that take the rows
    read and, at position t-1 (unwritten), the step's own): in the gather's targets, else in the caches' storages."""
    order, keys_out, writes_out = gather or (None, keys, writes)
    return order, (grown(keys_out, positions), grown(writes_out, positions))


def _decayed(decay: Optional[Tensor], alpha: Optional[Tensor]) -> Optional[Tensor]:
    """The gated rule's decays of the cached positions [B, H, t-1] times this step's alpha [B, H, 1]:
    c_s = gamma_t / gamma_s (in place without autograd: append's room)."""
    if decay is None or alpha is None:
        return decay
    return decay.mul_(alpha) if in_place() else decay * alpha


def _with_new_position(decay: Optional[Tensor], alpha: Optional[Tensor], positions: int) -> Optional[Tensor]:
    """The decays [B, H, t] with this position's 1 (not decayed yet) after them; None without alpha."""
    if alpha is None:
        return None
    # [B, H, 1, 1] rows for append's dim 2
    return append(None if decay is None else decay[..., None], alpha.new_ones(alpha.shape)[..., None],
                  positions)[..., 0]


def _scaled(u: Tensor, phi, key: Tensor, phi_k: Tensor, norm: Optional[str]) -> Tensor:
    """The write u [B, H, 1, M] as the cache keeps it: times phi_k's factor over phi.cached_features(key)."""
    return u if key is phi_k or norm is None else u * phi_scale(phi.cached_features(key), norm)  # [B, H, 1, 1]


def _read(phi_q: Tensor, phi_k: Tensor, v: Tensor, keys: Optional[Tensor], writes: Optional[Tensor],
          decay: Optional[Tensor], beta: Optional[Tensor], phi) -> Tuple[Tensor, Tensor]:
    """lazy_step's read of the cache (o [B, H, 1, M]) and the step's write u [B, H, 1, M] in PyTorch ops:
    where the map has no fused step (FeatureMap.cached_step), or autograd records."""
    u = v
    if writes is None:
        past = None
    else:
        # the query's row and, for the delta rule, the new key's row read the past in one pass
        rows = phi_q if beta is None else torch.cat([phi_q, phi_k], dim=2)  # [B, H, 1 or 2, E]
        scores = rows @ keys.transpose(-1, -2) if phi is None else phi.cached_scores(rows, keys)  # [B, H, 1 or 2, t-1]
        if decay is not None:
            scores = scores * decay[:, :, None, :]
        past = scores @ writes  # [B, H, 1 or 2, M]
        if beta is not None:
            u = v - past[:, :, 1:]  # v_t - phi(k_t) W_{t-1}
        past = past[:, :, :1]  # phi(q_t) W_{t-1}
    if beta is not None:
        u = beta[..., None] * u  # [B, H, 1, 1] * [B, H, 1, M]
    own = (phi_q * phi_k).sum(-1, keepdim=True) * u  # [B, H, 1, M]: position t reads its own write
    return (own if past is None else past + own), u


def fold(keys: Tensor, writes: Tensor, decay: Optional[Tensor], phi=None) -> Tensor:
    """The state of the cached positions, W = sum_s c_s phi(k_s)^T u_s: keys [B, H, t, C] (phi None:
    the features themselves, C = E), writes [B, H, t, M], decay [B, H, t] or None -> [B, H, E, M]."""
    phi_k = keys if phi is None else phi.cached_features(keys)  # [B, H, t, E]
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


def raw_causal_step(buffer: dict, phi, norm: Optional[str], q: Tensor, k: Tensor, v: Tensor,
                    scalars: Tuple[Tensor, ...], z_column: bool) -> Optional[Tensor]:
    """Generation's lazy step from the raw heads q, k [B, H, 1, d] (FeatureMap.raw_step: phi, its normalisation
    `norm` and, with `z_column` (the sum rule), v's ones column and the read's division by it, in the kernel):
    causal_step's o [B, H, 1, D] with the z column divided out, the buffer updated as causal_step updates it.
    None where it does not apply (autograd, the state, the step that folds the cache, no kernel): causal_step
    runs, the same function."""
    past = buffer.get("keys")  # [B', H, t-1, C]: rows of hypotheses, or with a lineage the storages' (B' >= B)
    width = v.size(-1) + z_column  # the writes' M
    positions = capacity(phi.out_dim, width, phi.cache_width)  # a step over t positions fits while t <= positions
    if (not in_place() or q.size(2) != 1 or "state" in buffer or (0 if past is None else past.size(2)) >= positions
            or not phi.has_raw_step(q, q if past is None else past)):
        return None
    if past is None:  # the first position: empty views of new storages, which the kernel's step starts
        past = buffer["keys"] = started(q, (phi.cache_width,), positions)  # [B, H, 0, C]
        buffer["writes"] = started(q, (width,), positions)  # [B, H, 0, M]
    beta, alpha = (*scalars, None, None)[:2]
    order = buffer.pop(ORDER, None)
    reorder_decay(buffer, order)
    decay = _decayed(buffer.get("decay"), alpha)
    # in the storages themselves, which the kernel's views of t positions [B', H, t, .] take: a reorder (or an earlier
    # one's lineage) makes its step traced
    lineage, writes = buffer.pop(LINEAGE, None), buffer["writes"]  # [B, t-1] or None
    o, after, *outs = phi.raw_step(q, k, v, beta, past, writes, decay, order, lineage, norm, z_column)
    if o is None:  # storages without room for position t-1: the same rows in storages with room (`grown`) first
        past, writes = (grown(x, positions)[:, :, :-1] for x in (past, writes))
        o, after, *outs = phi.raw_step(q, k, v, beta, past, writes, decay, order, lineage, norm, z_column)
    buffer["keys"], buffer["writes"] = outs
    if alpha is not None:
        buffer["decay"] = _with_new_position(decay, alpha, positions)
    if after is not None:  # [B, t]
        buffer[LINEAGE] = after
    return o


def causal_step(buffer: dict, rule, phi, norm: Optional[str], phi_q: Tensor, phi_k: Tensor, v: Tensor, keys: Tensor,
                scalars: Tuple[Tensor, ...]) -> Tensor:
    """The decoder self-attention of one layer in incremental decoding, over its buffer (updated): the lazy
    cache ("keys", "writes", "decay") while a step over it reads fewer values than the [E, M] state, then
    the state ("state"). rule: the block's UpdateRule; phi: its FeatureMap; norm: the normalisation of
    phi of keys and queries (--fw-delta-norm) where the rule has one, else None. phi_q [B, H, T, E]; the
    written positions' phi_k [B, H, T, E], v [B, H, T, M], keys [B, H, T, d], scalars [B, H, T] each.
    Returns o [B, H, T, M]."""
    settle(buffer)
    past = buffer.get("keys")  # [B, H, t-1, C] while the cache is live
    length = phi_q.size(2) + (0 if past is None else past.size(2))
    order = buffer.pop(ORDER, None)  # a reorder left for this step (generation)
    if phi_q.size(2) == 1 and fits(length, phi_q.size(-1), v.size(-1), phi.cache_width) and "state" not in buffer:
        key = phi.cache_row(keys, phi_k)  # [B, H, 1, C]
        gather = _gather(buffer, order)
        o, *cache = lazy_step(phi_q, phi_k, v, past, buffer.get("writes"), buffer.get("decay"), *scalars, phi=phi,
                              key=key, norm=norm, gather=gather)
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
    state = buffer.get("state", None if cache[0] is None else fold(*cache, phi=phi))
    if phi_q.size(2) == 1 and state is not None and in_place():
        # generation: the state is this layer's own, stepped in place or into its spare
        beta, alpha = (*scalars, None, None)[:2]
        o, buffer["state"], spare = step_state(phi_q, phi_k, v, beta, alpha, state, order,
                                               buffer.pop(spare_name("state"), None))
        if spare is not None:
            buffer[spare_name("state")] = spare
        return o
    state = state if order is None else state.index_select(0, order)
    o, buffer["state"] = rule.causal(phi_q, phi_k, v, *scalars, initial_state=state, output_final_state=True)
    return o
