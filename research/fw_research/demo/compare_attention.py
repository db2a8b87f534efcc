"""Translation quality of attention configurations at equal updates, on the German catalogs.

Every configuration trains the same model for the same number of updates with the same seeds
(fairseq-train --max-update), validates every updates/10, translates the held-out test split (beam 4)
and is scored with detokenised sacreBLEU. The ranking is therefore the same on a slow or busy machine as
on a quiet one; only the wall time, reported per update beside it, depends on the machine.
Each model also translates the long split (test_long: catalog messages of 16-40 words, none trained on;
fw_research.experiments.catalog_corpus), and the report gives, for the test and the long split, BLEU and the length
ratio by source length (<= 5, 6-15, > 15 words), the share of translations that loop (a token or an n-gram of up to
4 repeated 4 times in a row), the share that loops inside a word only, the number over twice their reference's
length, and the number cut at generation's length limit and how many of those loop.

    python -m fw_research.demo.compare_attention [--updates 600] [--seeds 1] [--configs NAME ...] [--jobs 2]
    python -m fw_research.demo.compare_attention --report-only   # table and plot again from the stored results
    python -m fw_research.demo.compare_attention --score-valid   # also BLEU on valid and valid_long, and the
                                                                 # configuration they choose
    python -m fw_research.demo.compare_attention --train-joined  # train on the training split plus its pairs
                                                                 # joined into messages of 20-60 words (same
                                                                 # dictionary and test splits)

Writes results/compare_attention/{preset}_u{updates}.json (every run: curve, BLEU, lengths, seconds per update),
.md (the table) and .png (the valid-loss curves); runs that finished are kept in --work-dir and skipped
when re-run. `softmax` and `hybrid` rows are baselines, not fast-weight models.
"""
import argparse
import json
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from fw_research.demo import compare_report
from fw_research.experiments import attention_runs, catalog_corpus, valid_scores
from fw_research.experiments.attention_configs import CONFIGS, PRESETS, config_flags, model_flags

REPO = Path(__file__).resolve().parents[3]


def without_hypotheses(record):
    """A run's record for the results file: its numbers, not its translations (those stay in --work-dir/runs)."""
    record = {k: v for k, v in record.items() if k != "hypotheses"}
    if "long" in record:
        record["long"] = {k: v for k, v in record["long"].items() if k != "hypotheses"}
    return record


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--updates", type=int, default=600, help="training updates of every model")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), metavar="NAME",
                        help=f"which rows (default all): {', '.join(CONFIGS)}")
    parser.add_argument("--preset", choices=list(PRESETS), default="demo")
    parser.add_argument("--jobs", type=int, default=1,
                        help="models trained at once, the cores split between them")
    parser.add_argument("--work-dir", type=Path, default=REPO / "compare_work")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results/compare_attention")
    parser.add_argument("--test-size", type=int, default=500)
    parser.add_argument("--lenpen-grid", type=float, nargs="+", metavar="LENPEN",
                        help="also translate the test split with the --lenpen of these that scores best on the "
                             "valid split, per run (a second BLEU column; the first keeps --lenpen 0.6 for all)")
    parser.add_argument("--train-joined", action="store_true",
                        help="train on the training split plus its pairs joined into messages of 20-60 words "
                             "(catalog_corpus.make_joined_train; the same dictionary and test splits), results "
                             "as {preset}_joined_u{updates}")
    parser.add_argument("--score-valid", action="store_true",
                        help="also translate the validation splits (valid, valid_long) and report the fast-weight "
                             "configuration they choose (fw_research.experiments.valid_scores)")
    parser.add_argument("--report-only", action="store_true",
                        help="rebuild the table and plot from the stored results, train nothing")
    args = parser.parse_args(argv)
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"argument --configs: unknown {', '.join(unknown)}; allowed: {', '.join(CONFIGS)}")
    if "softmax" not in args.configs:
        parser.error("argument --configs: include softmax, the reference every ratio is taken against")
    if args.updates < 10 or args.jobs < 1:
        parser.error("--updates must be >= 10 and --jobs >= 1")
    if args.lenpen_grid and min(args.lenpen_grid) < 0:
        parser.error("argument --lenpen-grid: values must be >= 0 (fairseq-generate's --lenpen), "
                     f"got {' '.join(map(str, args.lenpen_grid))}")
    return args


def main(argv=None):
    args = parse_args(argv)
    stem = args.out_dir / f"{args.preset}{'_joined' if args.train_joined else ''}_u{args.updates}"
    if args.report_only:
        print(compare_report.write(stem, json.loads(stem.with_suffix(".json").read_text())))
        return
    merges = PRESETS[args.preset][0]
    work = args.work_dir / args.preset
    print(catalog_corpus.prepare(work, args.test_size, merges, what="compare_attention"), flush=True)
    if args.train_joined:
        work, source = args.work_dir / f"{args.preset}-joined", work
        if not (work / "data-bin/train.en-de.de.idx").exists():
            print(f"joined training split: {catalog_corpus.make_joined_train(work, source, 'compare_attention')}",
                  flush=True)
    threads = max(1, (torch.get_num_threads()) // args.jobs)
    runs = [(config, seed) for seed in args.seeds for config in args.configs]
    start = time.time()

    def one(run):
        config, seed = run
        name = attention_runs.run_name(config, seed, args.updates)
        record = attention_runs.train_and_score(work, name, model_flags(args.preset, config, seed),
                                                args.updates, max(1, args.updates // 10), label=name,
                                                threads=threads if args.jobs > 1 else None)
        # records stored before the lengths were measured gain them (the long split translated from the checkpoint)
        record = attention_runs.measure_lengths(work, name, threads if args.jobs > 1 else None)
        if args.score_valid:
            record = valid_scores.score_valid(work, name, threads if args.jobs > 1 else None)
        if not args.lenpen_grid:
            return record
        return attention_runs.tune_lenpen(work, name, args.lenpen_grid, threads if args.jobs > 1 else None)

    with ThreadPoolExecutor(args.jobs) as pool:
        records = list(pool.map(one, runs))
    results = {
        "benchmark": "compare_attention", "preset": args.preset, "updates": args.updates,
        **({"training": "joined"} if args.train_joined else {}),
        "seeds": args.seeds, "jobs": args.jobs, "machine": platform.machine(),
        "cpu_count": torch.get_num_threads(), "torch": torch.__version__,
        # fairseq-train takes the GPU where there is one
        **({"device": torch.cuda.get_device_name()} if torch.cuda.is_available() else {}),
        "wall_minutes": round((time.time() - start) / 60, 1),
        "configs": {name: {"kind": CONFIGS[name][0], "flags": config_flags(args.preset, name)}
                    for name in args.configs},
        "runs": [{"config": config, "seed": seed, **without_hypotheses(record)}
                 for (config, seed), record in zip(runs, records)],
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    previous = json.loads(stem.with_suffix(".json").read_text()) if stem.with_suffix(".json").exists() else None
    if previous:  # rows run earlier with the same preset and updates stay in the table
        results = merged(previous, results)
    stem.with_suffix(".json").write_text(json.dumps(results, ensure_ascii=False, indent=1))
    print(compare_report.write(stem, results))
    print(f"results: {stem}.json, table {stem}.md, curves {stem}.png")


def merged(previous, results):
    """A results file `previous` with the rows of `results` (same preset and updates) added, or replacing its rows of
    the same configuration and seed. Its wall time and jobs are those of every invocation that brought it rows; an
    invocation that brings none (its runs stored, their counts measured again) keeps the file's machine as well."""
    rows = {(r["config"], r["seed"]): r for r in results["runs"]}
    new = rows.keys() - {(r["config"], r["seed"]) for r in previous["runs"]}
    # the file's rows in their order, a row run again in its place, the new rows after them
    runs = [rows.get((r["config"], r["seed"]), r) for r in previous["runs"]] + [rows[key] for key in rows if key in new]
    return {**(results if new else previous), "runs": runs, "configs": {**previous["configs"], **results["configs"]},
            "seeds": sorted({r["seed"] for r in runs}),
            "wall_minutes": round(previous.get("wall_minutes", 0) + (results["wall_minutes"] if new else 0), 1),
            "jobs": merged_jobs(previous["jobs"], results["jobs"] if new else None)}


def merged_jobs(previous, jobs):
    """Jobs at once of a results file's models: `previous` (a count, or a list of counts) with `jobs` (None: no
    more). One count stays a number."""
    counts = sorted(set(compare_report.job_counts(previous)) | set(compare_report.job_counts(jobs)))
    return counts[0] if len(counts) == 1 else counts


if __name__ == "__main__":
    main()
