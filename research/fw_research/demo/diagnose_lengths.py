"""Why a configuration's translations are shorter than another's: BLEU split into its brevity penalty and its n-gram
precisions, and where the model puts the end of a message.

For each run of a compare_attention results file (grouped by configuration, means over the seeds):

  BLEU         from the results file: BLEU = BP x (geometric mean of the 1-4-gram precisions), BP = exp(1 - 1/r) for
               a length ratio r < 1, so "BLEU / BP" is what the run would score at the references' length
  end of text  on the split's references, teacher-forced (float64 log-probabilities of the checkpoint): the negative
               log-probability per token of the words (eos left out), of eos where the reference ends, and of not
               ending before it, -sum_{t < T} log(1 - p_t(eos)) per message (the "early-eos mass": how much of its
               probability the model gives to stopping too soon)
  search       with --search, beam search again (as the comparison: beam 4, --lenpen 0.6): the share of messages whose
               translation is shorter than the reference (BPE tokens), and of those the share that the model scores
               below the reference (the beam's score, sum of log-probabilities / length^0.6, both teacher-forced in
               float64): a short translation scored above its reference is the model's choice, one below it a
               search error

    python -m fw_research.demo.diagnose_lengths --work-dir compare_work/demo \\
        --results results/compare_attention/long_outputs/demo_u2000.json [--subset test] [--search] [--out PREFIX]

Prints a markdown table; with --out writes PREFIX.md and PREFIX.json.
"""
import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

from fw_research.demo.diagnose_loops import beam_score, generate, load
from fw_research.demo.loop_reads import next_token_lprobs, teacher_forced
from fw_research.experiments import attention_runs


def end_of_text(model, dataset, eos):
    """(words NLL per token, eos NLL per message, early-eos mass per message) of the references, teacher-forced."""
    words, count, eos_nll, early = 0.0, 0, [], []
    for i in range(len(dataset)):
        source, target = dataset[i]["source"], dataset[i]["target"]
        lprobs = next_token_lprobs(model, source, target, eos)  # [T, V]
        gold = lprobs.gather(-1, target[:, None])[:, 0]  # [T]
        words -= float(gold[:-1].sum())
        count += target.numel() - 1
        eos_nll.append(-float(gold[-1]))
        early.append(-float(torch.log1p(-lprobs[:-1, eos].exp()).sum()))
    return words / count, statistics.mean(eos_nll), statistics.mean(early)


def short_translations(model, dataset, hypotheses):
    """(share of messages translated shorter than their reference, share of those whose reference the model scores
    above the translation): `hypotheses` maps a message's index to its translation's tokens (ending in eos)."""
    short = missed = 0
    for i, tokens in hypotheses.items():
        source, target = dataset[i]["source"], dataset[i]["target"]
        if tokens.numel() >= target.numel():
            continue
        short += 1
        missed += beam_score(teacher_forced(model, source, target)) > beam_score(teacher_forced(model, source, tokens))
    return short / len(hypotheses), missed / short if short else 0.0


def bleu_over_bp(scores):
    """The geometric mean of a score's 1-4-gram precisions: its BLEU without the brevity penalty."""
    return math.exp(statistics.mean(math.log(p) for p in scores["precisions"]))


def scores_of(run, subset):
    """A run record's sacreBLEU scores of `subset`: the record keeps the long split's apart, under "long"."""
    return run["long"] if subset == "test_long" else run


def checkpoint_of(work_dir, run):
    name = attention_runs.run_name(run["config"], run["seed"], run["updates"])
    return work_dir / "checkpoints" / name / "checkpoint_last.pt"


def add_run_arguments(parser, messages=None):
    """The arguments that choose the runs of a compare_attention results file and their checkpoints: --work-dir,
    --results, --configs, --seeds and --out, and with a default number of `messages`, --messages."""
    parser.add_argument("--work-dir", type=Path, required=True, help="the compare_attention work dir of the preset")
    parser.add_argument("--results", type=Path, required=True, help="a compare_attention results JSON")
    parser.add_argument("--configs", nargs="+", help="these configurations only (default: every one in --results)")
    parser.add_argument("--seeds", nargs="+", type=int, help="these seeds only (default: every one in --results)")
    parser.add_argument("--out", type=Path, help="write PREFIX.md and PREFIX.json")
    if messages is not None:
        parser.add_argument("--messages", type=int, default=messages, help=f"messages of a split (default {messages})")


def read_results(parser, args):
    """The --results file's contents; stops with one line (through `parser`) where it is missing or --messages is
    below 1."""
    if not args.results.is_file():
        parser.error(f"--results {args.results}: no such file (a compare_attention results JSON)")
    if getattr(args, "messages", 1) < 1:
        parser.error(f"--messages {args.messages}: at least 1")
    return json.loads(args.results.read_text())


def per_config(runs, stats_of):
    """{config: [{"seed", "stats": stats_of(run)}]} of `runs`, in their order; each run said on stderr when done."""
    rows = {}
    for run in runs:
        rows.setdefault(run["config"], []).append({"seed": run["seed"], "stats": stats_of(run)})
        print(f"{run['config']} seed {run['seed']}: done", file=sys.stderr)
    return rows


def report(args, text, benchmark, **record):
    """Prints `text`; with --out writes it to PREFIX.md and, to PREFIX.json, the benchmark's name, the --results
    file and `record`."""
    print(text)
    if args.out:
        args.out.with_suffix(".md").write_text(text)
        args.out.with_suffix(".json").write_text(json.dumps(
            {"benchmark": benchmark, "results": str(args.results), **record}, indent=1))


def runs_with_checkpoints(parser, args, results):
    """The runs of `results` that --configs and --seeds choose, in the file's order; stops with one line (through
    `parser`) where none is chosen or a chosen run has no checkpoint in --work-dir."""
    chosen = [run for run in results["runs"] if (args.configs is None or run["config"] in args.configs)
              and (args.seeds is None or run["seed"] in args.seeds)]
    if not chosen:
        parser.error(f"--configs {args.configs} --seeds {args.seeds}: no such run in {args.results}")
    missing = [path for path in (checkpoint_of(args.work_dir, run) for run in chosen) if not path.is_file()]
    if missing:
        parser.error(f"--work-dir {args.work_dir}: no checkpoint {missing[0]} (the work dir that trained the runs)")
    return chosen


def run_row(run, work_dir, subset, search=False):
    """The numbers of one run: its BLEU decomposed (results file), its end-of-text measures (checkpoint) and, with
    `search`, its short translations."""
    model, task = load(checkpoint_of(work_dir, run), work_dir / "data-bin", subset)
    dataset = task.dataset(subset)
    # the beam searches in float32, as fairseq-generate did for the results file; the scores are float64
    found = generate(model, task, subset, list(range(len(dataset)))) if search else None
    model = model.double()
    words, eos, early = end_of_text(model, dataset, task.target_dictionary.eos())
    scores = scores_of(run, subset)
    row = {"config": run["config"], "seed": run["seed"], "bleu": scores["bleu"], "bp": scores["bp"],
           "length_ratio": scores["length_ratio"], "bleu_over_bp": bleu_over_bp(scores), "words_nll": words,
           "eos_nll": eos, "early_eos": early}
    if search:
        row["short"], row["short_missed"] = short_translations(
            model, dataset, {i: hypo["tokens"] for i, hypo in found.items()})
    return row


COLUMNS = (("bleu", "BLEU", 2), ("length_ratio", "length ratio", 3), ("bp", "brevity penalty", 3),
           ("bleu_over_bp", "BLEU / BP", 2), ("words_nll", "NLL / word token", 3), ("eos_nll", "NLL of eos", 3),
           ("early_eos", "early-eos mass", 3), ("short", "shorter than the reference", 3),
           ("short_missed", "of those, reference scored higher", 3))


def table(rows, subset, order=()):
    """Markdown: one line per configuration (those in `order` first, in its order), means over its seeds."""
    configs = [c for c in order if any(row["config"] == c for row in rows)]
    configs += [c for c in dict.fromkeys(row["config"] for row in rows) if c not in configs]
    columns = [column for column in COLUMNS if all(column[0] in row for row in rows)]  # --search's if measured
    lines = [f"On the {subset} split, means over the seeds (references teacher-forced in float64):", "",
             "| configuration | seeds | " + " | ".join(title for _, title, _ in columns) + " |",
             "|---|---|" + "---:|" * len(columns)]
    for config in configs:
        mine = [row for row in rows if row["config"] == config]
        cells = [f"{statistics.mean(row[key] for row in mine):.{digits}f}" for key, _, digits in columns]
        seeds = ",".join(str(row["seed"]) for row in mine)
        lines.append(f"| {config} | {seeds} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser)
    parser.add_argument("--subset", default="test", choices=("test", "test_long"),
                        help="the split whose references are scored (the results file scores these two)")
    parser.add_argument("--search", action="store_true",
                        help="also translate the split again and score its short translations against the references")
    args = parser.parse_args(argv)
    results = read_results(parser, args)
    chosen = sorted(runs_with_checkpoints(parser, args, results), key=lambda run: run["seed"])
    rows = [run_row(run, args.work_dir, args.subset, args.search) for run in chosen]
    order = list(results["configs"])
    # the table can be drawn again from the JSON: table(runs, subset, configs)
    report(args, table(rows, args.subset, order), "diagnose_lengths", subset=args.subset, configs=order, runs=rows)


if __name__ == "__main__":
    main()
