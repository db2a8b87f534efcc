"""How widely the decoder's cross-attention spreads over the source, on short and on long sources. For each run of a
compare_attention results file, the first --messages references of the test split and of test_long are
teacher-forced through its checkpoint (cast to float64), and each decoder layer's cross-attention weights are
recomputed from the layer's projections and checked against the layer's own read:

  fast weights   w_ts = phi(q_t) . phi(k_s) / (sum_s' phi(q_t) . phi(k_s') + Z_EPS), the sum rule's read of the source;
                 aligned (--fw-cross-align P), each score phi(q_t) . phi(k_s) weighed by cos^2P of half the angle
                 between t and s (fw_fairseq/modules/cross_align.py) before the normalisation
  softmax        w_ts = softmax_s(q_t . k_s / sqrt(d))

  spread         exp(entropy of w_t), the number of source positions the read mixes as if evenly, over the source's
                 length: 1 reads the whole source alike, 1 / S one position
  top            the largest weight w_ts of a step

Means over heads, steps and messages, per decoder layer, then over the seeds of a configuration.

    python -m fw_research.demo.cross_spread --work-dir compare_work/base \\
        --results results/compare_attention/long_outputs/base_u2000.json --seeds 1 [--messages 200] [--out PREFIX]

Prints a markdown table; with --out writes PREFIX.md and PREFIX.json.
"""
import argparse

import torch

from fw_fairseq.modules.cross_align import align_factors, source_angles, target_angles
from fw_fairseq.ops.common.z_column import Z_EPS
from fw_research.demo.diagnose_lengths import (add_run_arguments, checkpoint_of, per_config, read_results, report,
                              runs_with_checkpoints)
from fw_research.demo.diagnose_loops import load
from fw_research.demo.loop_reads import captured, heads

SUBSETS = ("test", "test_long")


def capture(model):
    """Hooks keeping each decoder layer's cross-attention query [T, 1, C], source [S, 1, C] and read [T, 1, C]
    where it leaves the attention (the output gate's input where the block has one, else the output projection's)."""
    store, handles = [], []
    for layer in model.decoder.layers:
        attn, entry = layer.encoder_attn, {}
        store.append(entry)
        handles.append(attn.register_forward_pre_hook(
            lambda module, args, kwargs, entry=entry: entry.update(
                query=kwargs.get("query", args[0] if args else None),
                key=kwargs.get("key", args[1] if len(args) > 1 else None)), with_kwargs=True))
        gate = getattr(attn, "output_gate", None)
        handles.append(gate.register_forward_pre_hook(lambda module, args, entry=entry: entry.update(read=args[1]))
                       if gate is not None else attn.out_proj.register_forward_pre_hook(
                           lambda module, args, entry=entry: entry.update(read=args[0])))
    return store, handles


def weights(attn, query, key):
    """The layer's cross-attention weights [H, T, S] and values [H, S, D], float64."""
    q, k, v = heads(attn, attn.q_proj(query)), heads(attn, attn.k_proj(key)), heads(attn, attn.v_proj(key))
    if hasattr(attn, "block"):  # fast weights: the feature maps' dot products, normalised over the source
        phi_q = attn.block.features(q[None], is_query=True)[0]  # [H, T, E]
        phi_k = attn.block.features(k[None], is_query=False)[0]  # [H, S, E]
        scores = torch.einsum("hte,hse->hts", phi_q, phi_k)
        if attn.cross_align:
            scores = scores * alignment(attn.cross_align, attn.align_ratio, q.size(1), k.size(1))[None]
        return scores / (scores.sum(-1, keepdim=True) + Z_EPS), v
    return torch.softmax(torch.einsum("htd,hsd->hts", q * attn.scaling, k), dim=-1), v


def alignment(order, ratio, target_length, source_length):
    """The aligned cross-attention's weights w(t, s) [T, S] of one unpadded source, float64 (ratio:
    --fw-align-ratio)."""
    lengths = torch.tensor([float(source_length)], dtype=torch.float64)
    target = torch.arange(target_length, dtype=torch.float64)[None]  # [1, T]
    factors = (align_factors(target_angles(target, lengths, ratio), order)[0],
               align_factors(source_angles(None, lengths, source_length), order)[0])  # [T, R], [S, R]
    return factors[0] @ factors[1].T


def spread_and_top(w):
    """Per step of w [H, T, S]: exp(entropy) over S, and the largest weight, both [H, T]."""
    entropy = -(w * w.clamp_min(1e-300).log()).sum(-1)
    return entropy.exp() / w.size(-1), w.amax(-1)


def layer_stats(attn, entry):
    """{"spread", "top", "check"} of one layer on one message: means over heads and steps, and the largest
    difference of sum_s w_ts v_s from the layer's own read."""
    with torch.no_grad():
        w, v = weights(attn, entry["query"], entry["key"])
        spread, top = spread_and_top(w)
        read = torch.einsum("hts,hsd->htd", w, v)
        return {"spread": float(spread.mean()), "top": float(top.mean()),
                "check": float((read - heads(attn, entry["read"])).abs().max())}


def message_stats(model, source, target):
    """layer_stats of every decoder layer for one teacher-forced message."""
    store = captured(model, capture, source, target)
    return [layer_stats(layer.encoder_attn, entry) for layer, entry in zip(model.decoder.layers, store)]


def run_stats(checkpoint, data, messages):
    """{subset: [per layer {"spread", "top", "check"}]}: means over the first `messages` messages (the check: max)."""
    model, task = load(checkpoint, data, SUBSETS[0])  # one model for both splits
    for subset in SUBSETS[1:]:
        task.load_dataset(subset)
    model, out = model.double(), {}
    for subset in SUBSETS:
        dataset = task.dataset(subset)
        per_message = [message_stats(model, dataset[i]["source"], dataset[i]["target"])
                       for i in range(min(messages, len(dataset)))]
        out[subset] = [{"spread": sum(m[k]["spread"] for m in per_message) / len(per_message),
                        "top": sum(m[k]["top"] for m in per_message) / len(per_message),
                        "check": max(m[k]["check"] for m in per_message)} for k in range(len(per_message[0]))]
    return out


def mean_of(runs, subset, layer, measure):
    return sum(run["stats"][subset][layer][measure] for run in runs) / len(runs)


def table(rows):
    """Per configuration, means over its seeds: each layer's top weight, and the spread averaged over the layers,
    on the test split · on test_long."""
    layers = len(next(iter(rows.values()))[0]["stats"]["test"])
    head = "".join(f" top weight, layer {k} |" for k in range(layers))
    lines = [f"| configuration | seeds |{head} spread, mean of the layers |", "|---|---:|" + "---:|" * (layers + 1)]
    for config, runs in rows.items():
        tops = "".join(f" {mean_of(runs, 'test', k, 'top'):.3f} · {mean_of(runs, 'test_long', k, 'top'):.3f} |"
                       for k in range(layers))
        spread = {subset: sum(mean_of(runs, subset, k, "spread") for k in range(layers)) / layers
                  for subset in SUBSETS}
        lines.append(f"| {config} | {len(runs)} |{tops} {spread['test']:.3f} · {spread['test_long']:.3f} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, messages=200)
    args = parser.parse_args(argv)
    results = read_results(parser, args)
    rows = per_config(runs_with_checkpoints(parser, args, results),
                      lambda run: run_stats(checkpoint_of(args.work_dir, run), args.work_dir / "data-bin",
                                            args.messages))
    check = max(s["check"] for runs in rows.values() for run in runs for subset in SUBSETS for s in run["stats"][subset])
    text = (f"Cross-attention top weight and spread, the test split · test_long (the first {args.messages} messages "
            f"of each), means over the seeds; the weights' read agrees with the layers' own to {check:.1e}.\n\n"
            f"{table(rows)}\n")
    report(args, text, "cross_spread", messages=args.messages, configs=rows)


if __name__ == "__main__":
    main()
