"""Seconds per training update on CPU: fast-weight models against softmax, side by side in one process.

Builds the attention comparison's models (fw_research.experiments.attention_configs: the
`demo` preset and rows of fw_research.demo.compare_attention) through
fairseq's real parser, task and criterion on the catalog corpus (built under --work-dir if missing), and
times full updates (forward, label-smoothed loss, backward, Adam step) on the same real batches. The
models take turns batch by batch, so a change in the machine's load falls on all of them alike; each
row's time is the median over its batches of the per-batch times, summed, so one slow moment does not
move it. `--profile ROW` prints torch.profiler's top operators of that row instead.

    python -m fw_research.benchmarks.bench_train_cpu [--rows softmax elu-sum ...] [--batches 40] [--rounds 3]

Writes results/train_cpu.{json,md} under benchmarks/ (machine and threads named).
"""
import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from fairseq import options, tasks

import fw_fairseq  # noqa: F401  (registers the models)
from fw_research.experiments import catalog_corpus
from fw_research.experiments.attention_configs import CONFIGS, PRESETS, model_flags

REPO = Path(__file__).resolve().parents[3]

DEFAULT_ROWS = ["softmax", "elu-sum", "dpfp2-sum", "dpfp2-delta-dec-l2"]


class Row:
    """One configuration: its model, criterion and optimiser, built like fairseq-train builds them."""

    def __init__(self, name, data, preset):
        parser = options.get_training_parser()
        argv = [str(data), "--task", "translation", *model_flags(preset, name, seed=1)]
        args = options.parse_args_and_arch(parser, argv)
        torch.manual_seed(1)
        self.task = tasks.setup_task(args)
        self.model = self.task.build_model(args).train()
        self.criterion = self.task.build_criterion(args)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=args.lr[0], betas=(0.9, 0.98))
        self.name, self.args = name, args

    def update(self, sample):
        """One training update on `sample`; returns its wall seconds."""
        start = time.perf_counter()
        self.optimizer.zero_grad(set_to_none=True)
        loss, _, _ = self.criterion(self.model, sample)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        return time.perf_counter() - start


def batches(row, count):
    """The first `count` training batches of fairseq's own batching (--max-tokens, bucketed by length)."""
    row.task.load_dataset("train")
    dataset = row.task.dataset("train")
    itr = row.task.get_batch_iterator(dataset, max_tokens=row.args.max_tokens, seed=1,
                                      required_batch_size_multiple=1).next_epoch_itr(shuffle=True)
    return [next(itr) for _ in range(count)]


def profile(row, samples):
    from torch.profiler import ProfilerActivity, profile as torch_profile
    for sample in samples[:3]:
        row.update(sample)
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for sample in samples:
            row.update(sample)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", default=DEFAULT_ROWS, choices=list(CONFIGS))
    parser.add_argument("--batches", type=int, default=40, help="real training batches, the same for every row")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the batches (the first is warm-up)")
    parser.add_argument("--work-dir", type=Path, default=REPO / "compare_work/demo")
    parser.add_argument("--profile", choices=list(CONFIGS), help="print the operators of one row, time nothing")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/train_cpu")
    args = parser.parse_args(argv)
    if "softmax" not in args.rows:
        parser.error("argument --rows: include softmax, the reference every ratio is taken against")
    print(catalog_corpus.prepare(args.work_dir, 500, PRESETS["demo"][0], what="bench_train_cpu",
                                 long_split=False), flush=True)  # only the training split is timed
    data = args.work_dir / "data-bin"
    if args.profile:
        row = Row(args.profile, data, "demo")
        profile(row, batches(row, args.batches))
        return
    rows = [Row(name, data, "demo") for name in args.rows]
    samples = batches(rows[0], args.batches)
    times = {row.name: [[] for _ in samples] for row in rows}  # row -> per batch -> seconds of each round
    for round_ in range(args.rounds):
        for i, sample in enumerate(samples):
            for row in rows:
                seconds = row.update(sample)
                if round_ > 0:  # the first round warms up allocators and caches
                    times[row.name][i].append(seconds)
    per_update = {name: sum(statistics.median(t) for t in per_batch) / len(samples)
                  for name, per_batch in times.items()}
    tokens = sum(int(s["ntokens"]) for s in samples) / len(samples)
    result = {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
              "threads": torch.get_num_threads(), "torch": torch.__version__, "batches": len(samples),
              "rounds": args.rounds, "target_tokens_per_batch": tokens,
              "seconds_per_update": per_update,
              "ratio_to_softmax": {n: s / per_update["softmax"] for n, s in per_update.items()}}
    lines = [f"demo preset, {len(samples)} real batches ({tokens:.0f} target tokens each on average), "
             f"median of {args.rounds - 1} timed rounds, {result['threads']} threads, torch {torch.__version__}",
             "", "| configuration | s / update | × softmax |", "|---|---:|---:|"]
    lines += [f"| {n} | {s:.4f} | {result['ratio_to_softmax'][n]:.2f}× |" for n, s in per_update.items()]
    table = "\n".join(lines)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
