"""How many features a query's or a key's phi spreads over, in every fast-weight block, and how far the decoder's
delta rule moves a key's own slot per write. For each run of a compare_attention results file, the first --messages
references of --subset are teacher-forced through its checkpoint (cast to float64), and each block's phi of its
queries and keys is recomputed from the layer's projections:

  share    ||phi / sum(phi)||^2, the inverse participation ratio: 1 where one feature holds all of phi, 1 / E where
           all E features hold alike; under the sum normalisation (--fw-delta-norm sum) it is ||phi(k)||^2 itself
  step     beta ||phi(k)||^2 with phi normalised as the rule normalises it (delta rules only): a write moves its
           key's slot that share of the way to its value (W^T phi(k) after = (1 - step) before + step v, for a
           slot no other key shares); with the L2 normalisation it is beta itself

Means over heads, positions and messages, per block and layer, then over the seeds of a configuration. The table
gives each value per layer, first layer first (layer 0 / layer 1 / ...).

    python -m fw_research.demo.feature_spread --work-dir compare_work/demo \\
        --results results/compare_attention/long_outputs/aligned_unlikelihood/maps/demo_u600.json --seeds 1 \\
        [--subset test_long] [--messages 100] [--out PREFIX]

Prints a markdown table; with --out writes PREFIX.md and PREFIX.json.
"""
import argparse

import torch

from fw_research.demo.diagnose_lengths import (add_run_arguments, checkpoint_of, per_config, read_results, report,
                              runs_with_checkpoints)
from fw_research.demo.diagnose_loops import load
from fw_research.demo.loop_reads import betas, captured, heads

BLOCKS = ("encoder", "decoder", "cross")  # the encoder's and the decoder's self-attention, the cross-attention


def attentions(model):
    """(block, layer, attention module) of every fast-weight block; softmax blocks (no `block`) are left out."""
    found = [("encoder", i, layer.self_attn) for i, layer in enumerate(model.encoder.layers)]
    for i, layer in enumerate(model.decoder.layers):
        found += [("decoder", i, layer.self_attn), ("cross", i, layer.encoder_attn)]
    return [(block, i, attn) for block, i, attn in found if hasattr(attn, "block")]


def capture(model):
    """Hooks keeping each fast-weight block's query [T, 1, C] and key input [S, 1, C] (the query's, where the block
    is a self-attention called without a key)."""
    store, handles = {}, []
    for block, i, attn in attentions(model):
        def keep(module, args, kwargs, name=(block, i)):
            query = kwargs.get("query", args[0] if args else None)
            key = kwargs.get("key", args[1] if len(args) > 1 else None)
            store[name] = (query, query if key is None else key)
        handles.append(attn.register_forward_pre_hook(keep, with_kwargs=True))
    return store, handles


def share(phi):
    """||phi / sum(phi)||^2 over the last dim: [..., E] -> [...]."""
    p = phi / phi.sum(-1, keepdim=True).clamp_min(torch.finfo(phi.dtype).tiny)
    return (p * p).sum(-1)


def block_stats(attn, query, key):
    """{"q", "k"} shares and, for a rule with beta, {"beta", "step"}: means over heads and positions."""
    with torch.no_grad():
        q, k = heads(attn, attn.q_proj(query)), heads(attn, attn.k_proj(key))  # [H, T, D], [H, S, D]
        stats = {"q": float(share(attn.phi(q[None], is_query=True)).mean()),
                 "k": float(share(attn.phi(k[None], is_query=False)).mean())}
        if "beta" in attn.rule.scalars:
            beta = betas(attn, key)  # [H, S]
            phi_k = attn.block.features(k[None], is_query=False)[0]  # normalised as the rule normalises it
            stats.update(beta=float(beta.mean()), step=float((beta * (phi_k * phi_k).sum(-1)).mean()))
        return stats


def run_stats(checkpoint, data, subset, messages):
    """{"block layer": means of block_stats over the first `messages` messages of `subset`}."""
    model, task = load(checkpoint, data, subset)
    model, dataset, sums = model.double(), task.dataset(subset), {}
    count = min(messages, len(dataset))
    for index in range(count):
        store = captured(model, capture, dataset[index]["source"], dataset[index]["target"])
        for block, i, attn in attentions(model):
            for measure, value in block_stats(attn, *store[(block, i)]).items():
                key = f"{block} {i}"
                sums.setdefault(key, {}).setdefault(measure, 0.0)
                sums[key][measure] += value / count
    return sums


def table(rows):
    """Per configuration, means over its seeds, per layer: each block's shares of queries · of keys, and the
    decoder's beta · step."""
    def mean(runs, name, measure):
        values = [run["stats"][name][measure] for run in runs if measure in run["stats"].get(name, {})]
        return sum(values) / len(values) if values else None

    def cell(runs, block, measures):
        names = sorted({name for run in runs for name in run["stats"] if name.split()[0] == block})
        parts = [[mean(runs, name, m) for name in names] for m in measures]  # None: a layer without it
        return " · ".join("–" if all(v is None for v in p) else " / ".join("–" if v is None else f"{v:.3f}"
                                                                           for v in p) for p in parts)

    lines = ["| configuration | seeds | encoder: q · k | decoder: q · k | cross: q · k | decoder: beta · step |",
             "|---|---:|---|---|---|---|"]
    for config, runs in rows.items():
        cells = [cell(runs, block, ("q", "k")) for block in BLOCKS] + [cell(runs, "decoder", ("beta", "step"))]
        lines.append(f"| {config} | {len(runs)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_arguments(parser, messages=100)
    parser.add_argument("--subset", default="test_long", choices=("test", "test_long"), help="default test_long")
    args = parser.parse_args(argv)
    results = read_results(parser, args)
    fast = [run for run in runs_with_checkpoints(parser, args, results)
            if results["configs"][run["config"]]["kind"] != "softmax"]  # softmax blocks have no phi
    rows = per_config(fast, lambda run: run_stats(checkpoint_of(args.work_dir, run), args.work_dir / "data-bin",
                                                  args.subset, args.messages))
    text = (f"The share of one feature in phi, ||phi / sum(phi)||^2 (1: one feature holds it all), of the queries · "
            f"of the keys of each block, and the decoder's beta · step, per layer (layer 0 / 1 / ...), on "
            f"{args.subset} (the first {args.messages} messages), means over the seeds.\n\n{table(rows)}\n")
    report(args, text, "feature_spread", subset=args.subset, messages=args.messages, configs=rows)


if __name__ == "__main__":
    main()
