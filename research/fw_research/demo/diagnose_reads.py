"""How large each decoder self-attention read is at each position of a message: a count of the position the layer
hands on, where the rule's state grows with the number of writes.

For each checkpoint (a compare_attention run), the references of a split are teacher-forced (float64) and each
decoder layer's self-attention read is measured before anything that follows it (--fw-output-gate, then the output
projection): the norm of each head's read, the mean over the heads, per position bucket of the target (BPE tokens,
eos included). Beside it, the training split's target lengths, the positions the model saw.

    python -m fw_research.demo.diagnose_reads --work-dir compare_work/demo \\
        --runs dpfp2-sum-vconv3.s1.u600 dpfp2-delta-dec-vconv3.s1.u600 --subsets test test_long --limit 80 \\
        --out results/compare_attention/long_outputs/read_sizes_demo_u600

Writes PREFIX.json and PREFIX.md.
"""
import argparse
import json
import statistics
from pathlib import Path

import torch

from fw_research.demo.diagnose_loops import load
from fw_research.demo.loop_reads import capture_inputs, teacher_forced

BUCKETS = ((0, 5), (5, 10), (10, 15), (15, 20), (20, 30), (30, 45), (45, 80))


def read_sizes(model, dataset, limit):
    """Per decoder layer, per position bucket: the mean over positions of the heads' mean read norm."""
    sizes = [{bucket: [] for bucket in BUCKETS} for _ in model.decoder.layers]
    heads = model.decoder.layers[0].self_attn.num_heads
    store, handles = capture_inputs(model)  # each message's forward overwrites the layers' entries
    try:
        for index in range(min(limit, len(dataset))):
            item = dataset[index]
            teacher_forced(model, item["source"], item["target"])
            _add_positions(sizes, store, heads)
    finally:
        for handle in handles:
            handle.remove()
    return [{f"{lo}-{hi - 1}": (round(statistics.fmean(v), 3) if v else None) for (lo, hi), v in layer.items()}
            for layer in sizes]


def _add_positions(sizes, store, heads):
    """Adds one message's per-position read sizes of each layer (store: capture_inputs' entries) to its buckets."""
    for layer, entry in zip(sizes, store):
        read = entry["read"][:, 0]  # [T, 1, C] -> [T, C]
        norms = read.reshape(read.size(0), heads, -1).norm(dim=-1).mean(-1)  # [T, H, D] -> [T]
        for position, value in enumerate(norms.tolist()):
            bucket = next((b for b in BUCKETS if b[0] <= position < b[1]), None)
            if bucket is not None:
                layer[bucket].append(value)


def training_lengths(task):
    """Quantiles of the training split's target lengths (BPE tokens, eos included)."""
    task.load_dataset("train")
    sizes = sorted(task.dataset("train").tgt_sizes.tolist())
    return {q: sizes[min(len(sizes) - 1, int(q / 100 * len(sizes)))] for q in (50, 95, 99, 100)}


def table(report):
    lines = ["| run | split | layer | " + " | ".join(f"{lo}–{hi - 1}" for lo, hi in BUCKETS) + " |",
             "|---|---|---:|" + "---:|" * len(BUCKETS)]
    for name, run in report["runs"].items():
        for subset, layers in run["subsets"].items():
            for index, layer in enumerate(layers):
                cells = ["–" if v is None else f"{v:.2f}" for v in layer.values()]
                lines.append(f"| {name} | {subset} | {index} | " + " | ".join(cells) + " |")
    lengths = report["training_target_tokens"]
    return "\n".join([
        f"Norm of each decoder self-attention head's read (mean over heads and positions) by target position "
        f"(BPE tokens from 0), references teacher-forced in float64, the first {report['limit']} messages of each "
        f"split. Training targets: median {lengths['50']} tokens, 95% ≤ {lengths['95']}, 99% ≤ {lengths['99']}, "
        f"longest {lengths['100']}.", "", *lines, ""])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", type=Path, required=True, help="a compare_attention work dir (its preset's)")
    parser.add_argument("--runs", nargs="+", required=True, help="run names: checkpoints/NAME/checkpoint_last.pt")
    parser.add_argument("--subsets", nargs="+", default=["test", "test_long"], choices=("test", "test_long"))
    parser.add_argument("--limit", type=int, default=80, help="the first N messages of each split")
    parser.add_argument("--out", type=Path, required=True, help="write PREFIX.json and PREFIX.md")
    args = parser.parse_args(argv)
    report = {"benchmark": "diagnose_reads", "limit": args.limit, "runs": {}}
    for name in args.runs:
        checkpoint = args.work_dir / "checkpoints" / name / "checkpoint_last.pt"
        if not checkpoint.is_file():
            parser.error(f"--runs {name}: no checkpoint at {checkpoint}")
        model, task = load(checkpoint, args.work_dir / "data-bin", args.subsets[0])
        model.double()  # in place
        run = {"subsets": {}}
        for subset in args.subsets:
            task.load_dataset(subset)
            run["subsets"][subset] = read_sizes(model, task.dataset(subset), args.limit)
        if "training_target_tokens" not in report:  # one data-bin for every run
            report["training_target_tokens"] = {str(q): n for q, n in training_lengths(task).items()}
        report["runs"][name] = run
    args.out.parent.mkdir(parents=True, exist_ok=True)
    Path(f"{args.out}.json").write_text(json.dumps(report, indent=1))
    Path(f"{args.out}.md").write_text(table(report))
    print(table(report))
    return report


if __name__ == "__main__":
    main()
