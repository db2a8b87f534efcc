"""BLEU on the validation splits, for choosing between configurations without looking at a test split.

A run (attention_runs.train_and_score) is scored on `valid` (held-out catalog messages like the training split's) and
on `valid_long` (16-40 words, longer than any trained on, disjoint from test_long; catalog_corpus.LONG_SPLITS) where
the work directory has it, from its checkpoint, beam 4 and the same --lenpen as the test split. The rule is fixed
before any score is seen: among the fast-weight configurations, the one with the highest mean over its seeds of
(valid BLEU + valid_long BLEU) / 2 is chosen, and its test and long-split BLEU are the ones to report. The section
below the report's tables (compare_report) gives every configuration's validation BLEU and the choice.
"""
import json
import statistics
import sys
from pathlib import Path

from fw_research.experiments.attention_runs import score, translate

SPLITS = ("valid", "valid_long")


def splits_of(work):
    """The validation splits the work directory has, binarised and raw."""
    work = Path(work)
    return [split for split in SPLITS
            if (work / f"data-bin/{split}.en-de.de.idx").is_file() and (work / f"raw/{split}.de").is_file()]


def score_valid(work, name, threads=None):
    """The run's record with "valid_bleu" {split: BLEU} for each validation split of the work directory, translated
    from the run's checkpoint and kept in the record (a re-run translates nothing)."""
    work = Path(work)
    record_file = work / "runs" / f"{name}.json"
    record = json.loads(record_file.read_text())
    scores = record.setdefault("valid_bleu", {})
    missing = [split for split in splits_of(work) if split not in scores]
    if not missing:
        return record
    checkpoint = work / "checkpoints" / name / "checkpoint_last.pt"
    if not checkpoint.is_file():
        sys.exit(f"{checkpoint} is missing: --score-valid needs each run's checkpoint in --work-dir")
    for split in missing:
        references = (work / f"raw/{split}.de").read_text().splitlines()
        hypotheses = translate(work / "data-bin", checkpoint, work / f"generate.{name}.{split}.txt", split,
                               threads=threads)
        scores[split] = score(hypotheses, references)["bleu"]
    record_file.write_text(json.dumps(record, ensure_ascii=False, indent=1))
    return record


def selection(results):
    """The report's section on the validation splits of a compare_attention result file (lines, none where no run
    was scored on them): each configuration's mean validation BLEU over its seeds, and the fast-weight configuration
    chosen by the rule above with its test and long-split BLEU."""
    means = {}
    for name, config in results["configs"].items():
        runs = [r for r in results["runs"] if r["config"] == name and r.get("valid_bleu")]
        if runs:
            means[name] = {split: statistics.fmean(r["valid_bleu"][split] for r in runs)
                           for split in SPLITS if all(split in r["valid_bleu"] for r in runs)}
            means[name].update(kind=config["kind"], seeds=len(runs),
                               test=statistics.fmean(r["bleu"] for r in runs),
                               long=statistics.fmean(r["long"]["bleu"] for r in runs) if all(
                                   "long" in r for r in runs) else None)
    if not means:
        return []
    splits = [split for split in SPLITS if all(split in row for row in means.values())]
    lines = ["", "BLEU on the validation splits (means over the seeds; the choice among the fast-weight rows: the "
                 f"highest mean of {' and '.join(splits)}):", "",
             "| configuration | seeds | " + " | ".join(splits) + " | mean |", "|---|---:|" + "---:|" * (len(splits) + 1)]
    for name, row in means.items():
        row["mean"] = statistics.fmean(row[split] for split in splits)
        lines.append(f"| {name} | {row['seeds']} | " + " | ".join(f"{row[split]:.2f}" for split in splits)
                     + f" | {row['mean']:.2f} |")
    fast = {name: row for name, row in means.items() if row["kind"] == "fast"}
    if fast:
        chosen = max(fast, key=lambda name: fast[name]["mean"])
        long = f", long split {fast[chosen]['long']:.2f}" if fast[chosen]["long"] is not None else ""
        lines += ["", f"Chosen on the validation splits: {chosen}; its test BLEU {fast[chosen]['test']:.2f}{long}."]
    return lines
