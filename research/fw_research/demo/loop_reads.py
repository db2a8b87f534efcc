"""What the decoder's fast-weight self-attention reads over a teacher-forced translation
(fw_research.demo.diagnose_loops's (c, d)): each layer's read recomputed in float64 from its projections, checked
against the layer's own output, and per step the write strength beta, the cosines of consecutive keys, of query and key,
of consecutive reads and of the read with the value, the normaliser (the sum rule's and delta_z's), how full delta_z's
slot of the key is, and the share of the read the earlier positions carry.
"""
import math
import statistics

import torch
import torch.nn.functional as F

from fw_fairseq.ops import append_z_column, divide_by_z


def next_token_lprobs(model, source, target, eos):
    """Log-probabilities [T, V] of every next token along `target` (ending in eos) given `source` (ending in eos),
    teacher-forced: the decoder's input is `target` shifted right behind eos."""
    prev = torch.cat([target.new_tensor([eos]), target[:-1]])  # [T]
    with torch.no_grad():
        net = model(source[None], torch.tensor([source.numel()]), prev[None])
        return model.get_normalized_probs(net, log_probs=True)[0]


def teacher_forced(model, source, target):
    """Per-token log-probabilities [T] of `target` (ending in eos) given `source` (ending in eos)."""
    lprobs = next_token_lprobs(model, source, target, model.decoder.dictionary.eos())
    return lprobs.gather(-1, target[:, None])[:, 0].to(torch.float64)


def capture_inputs(model):
    """Hooks that keep each decoder layer's self-attention input x [T, 1, C] and its read [T, 1, C] where it leaves
    the rule: the output gate's input where the block has one (--fw-output-gate), else the output projection's."""
    store, handles = [], []
    for layer in model.decoder.layers:
        attn, entry = layer.self_attn, {}
        store.append(entry)
        handles.append(attn.register_forward_pre_hook(
            lambda module, args, kwargs, entry=entry: entry.__setitem__("x", kwargs.get("query", args[0] if args
                                                                                          else None)),
            with_kwargs=True))
        gate = getattr(attn, "output_gate", None)  # softmax blocks have none
        handles.append(gate.register_forward_pre_hook(
            lambda module, args, entry=entry: entry.__setitem__("read", args[1])) if gate is not None else
            attn.out_proj.register_forward_pre_hook(
                lambda module, args, entry=entry: entry.__setitem__("read", args[0])))
    return store, handles


def heads(attn, x):
    """[T, 1, C] -> [H, T, D] in float64."""
    length = x.size(0)
    return x.reshape(length, attn.num_heads, attn.head_dim).permute(1, 0, 2).to(torch.float64)


def betas(attn, x):
    """The delta rule's write strengths [H, T] of the written positions x [T, 1, C], float64."""
    return torch.sigmoid(attn.beta_proj(x).to(torch.float64))[:, 0].T * attn.beta_max  # [T, 1, H] -> [H, T]


def recompute(attn, x):
    """The layer's read recomputed in float64 from its projections, with its parts: dict of [H, T(, ...)] tensors."""
    with torch.no_grad():
        q, k, v = (heads(attn, proj(x)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj))
        phi_q = attn.block.features(q[None], is_query=True)[0]
        phi_k = attn.block.features(k[None], is_query=False)[0]
        length = q.size(1)
        out = {"phi_q": phi_q, "phi_k": phi_k, "v": v}
        if "beta" in attn.rule.scalars:
            beta = betas(attn, x)  # [H, T]
            out["beta"] = beta
            if attn.rule.z_column:  # delta_z: z, the rule's memory of a constant 1, is the values' last column
                v = append_z_column(v[None])[0]  # [H, T, D + 1]
            state = torch.zeros(q.size(0), phi_k.size(-1), v.size(-1), dtype=torch.float64)
            reads, retrieved, change = [], [], []
            for t in range(length):
                old = torch.einsum("he,hem->hm", phi_k[:, t], state)  # what the key reads before its write
                retrieved.append(old)
                write = beta[:, t, None, None] * phi_k[:, t, :, None] * (v[:, t] - old)[:, None, :]
                state = state + write
                change.append(write.flatten(1).norm(dim=-1) / state.flatten(1).norm(dim=-1).clamp_min(1e-12))
                reads.append(torch.einsum("he,hem->hm", phi_q[:, t], state))
            out["read"] = torch.stack(reads, 1)
            out["retrieved"] = torch.stack(retrieved, 1)
            out["state_change"] = torch.stack(change, 1)
            if attn.rule.z_column:  # the read over z . phi(q); z . phi(k) after the write: how full the key's slot is
                # after the write the key reads old + beta ||phi_k||^2 (v - old): its z column is the slot's fill
                old, z_k = out["retrieved"][..., -1], v[..., -1]  # [H, T]
                out["key_fill"] = old + beta * (phi_k * phi_k).sum(-1) * (z_k - old)
                out["z"], out["read"], out["v"] = out["read"][..., -1], divide_by_z(out["read"]), v[..., :-1]
        else:  # the sum rule: y_t = sum_s (phi_q_t . phi_k_s) v_s / sum_s phi_q_t . phi_k_s
            scores = torch.einsum("hte,hse->hts", phi_q, phi_k).tril()
            z = scores.sum(-1)
            out["z"] = z
            out["scores"] = scores
            out["read"] = torch.einsum("hts,hsm->htm", scores, v) / (z[..., None] + 1e-6)
            writes = phi_k[..., :, None] * v[..., None, :]  # [H, T, E, D]
            state = writes.cumsum(1)
            out["state_change"] = writes.flatten(2).norm(dim=-1) / state.flatten(2).norm(dim=-1).clamp_min(1e-12)
        return out


def _cos(a, b):
    return F.cosine_similarity(a, b, dim=-1)


def read_stats(parts, start, end):
    """Means over heads of per-step measures, on the loop steps [start, end) and on the steps before the loop."""
    read, v, phi_q, phi_k = parts["read"], parts["v"], parts["phi_q"], parts["phi_k"]
    steps = {"loop": list(range(max(start, 1), end)), "before": list(range(1, start))}
    per_step = {
        "read_vs_previous_read": _cos(read[:, 1:], read[:, :-1]),  # index t-1 for step t
        "read_vs_own_value": _cos(read, v),
        "key_vs_previous_key": _cos(phi_k[:, 1:], phi_k[:, :-1]),
        "query_vs_key": _cos(phi_q, phi_k),
        "read_norm": read.norm(dim=-1),
        "state_change": parts["state_change"],  # ||this step's write|| / ||the state after it||
    }
    if "beta" in parts:
        per_step["beta"] = parts["beta"]
        # how much of what the key held before this write stays after it: 1 - beta ||phi_k||^2
        per_step["kept_at_key"] = 1 - parts["beta"] * (phi_k * phi_k).sum(-1)
        if "z" in parts:  # delta_z: its normaliser z . phi(q), and z . phi(k) after the write (1: the slot is full)
            per_step["normaliser"] = parts["z"]
            per_step["key_fill"] = parts["key_fill"]
    else:
        per_step["normaliser"] = parts["z"]
        # the share of the read's weight on the positions before the loop
        scores = parts["scores"]
        before = scores[..., :start].sum(-1) / scores.sum(-1).clamp_min(1e-12)
        per_step["weight_before_loop"] = before
    stats = {}
    for name, values in per_step.items():
        shift = 1 if name in ("read_vs_previous_read", "key_vs_previous_key") else 0
        stats[name] = {kind: (float(values[:, [t - shift for t in ts]].mean()) if ts else None)
                       for kind, ts in steps.items()}
    return stats


def captured(model, capture, source, target):
    """What the hooks of capture(model) -> (store, handles) keep while `target` is teacher-forced: the store."""
    store, handles = capture(model)
    try:
        teacher_forced(model, source, target)
    finally:
        for handle in handles:
            handle.remove()
    return store


def analyse_reads(model, source, target, start, end):
    """Per decoder layer: read_stats of the teacher-forced `target`, and the largest difference of the recomputed
    read from the layer's own (a check of the recomputation)."""
    store = captured(model, capture_inputs, source, target)
    layers = []
    for layer, entry in zip(model.decoder.layers, store):
        attn = layer.self_attn
        parts = recompute(attn, entry["x"])
        own = heads(attn, entry["read"])
        stats = read_stats(parts, start, end)
        stats["check_max_abs_diff"] = float((own - parts["read"]).abs().max())
        layers.append(stats)
    return layers


def mean_layers(cases):
    """Per layer, per measure, per kind of step: the mean over the analysed cases."""
    out = []
    for layer in range(len(cases[0])):
        stats = {}
        for measure, value in cases[0][layer].items():
            if measure == "check_max_abs_diff":
                stats[measure] = max(c[layer][measure] for c in cases)
                continue
            stats[measure] = {kind: _nanmean([c[layer][measure][kind] for c in cases]) for kind in value}
        out.append(stats)
    return {"cases": len(cases), "layers": out}


def _nanmean(values):
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(values) if values else None
