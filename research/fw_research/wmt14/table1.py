#!/usr/bin/env python3
"""Render the paper's Table 1 (WMT14 En-De BLEU by model and d_dot) from our result JSONs.

Each cell reads "ours (paper)". The row and d_dot column of a result come from its config
file (TABLE1_ROW, TABLE1_DDOT in configs/wmt14_en_de/<config>.sh), the score from the JSON
that scripts/wmt14/evaluate.sh wrote; by default only checkpoint_best.pt results count, as the
paper selects by validation BLEU and does not average.
"""
import argparse
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DDOTS = (64, 256, 512)
SUBSETS = ("valid", "test")
ROW_ORDER = ("Standard", "Linear", "Performer", "DPFP", "DPFP + delta", "DPFP + delta, softmax cross-attention",
             "DPFP + delta, aligned cross-attention, unlikelihood")
METRICS = {  # each metric, and what its numbers compare with
    "sacrebleu": "sacreBLEU (detokenised; the metric the paper cites for Table 1, Post 2018)",
    "tok_bleu": "tokenised BLEU (compound-split, as Vaswani et al. 2017 and Ott et al. 2018 report it; their data "
                "differs from this WMT14 preparation, so it compares with their numbers only roughly)"}

# Schlag, Irie & Schmidhuber (2021), Table 1: {row: {(subset, d_dot): BLEU}}.
PAPER = {
    "Standard": {("valid", 64): 26.6, ("test", 64): 27.7},
    "Linear": {("valid", 64): 25.5, ("test", 64): 26.8},
    "Performer": {("valid", 64): 24.2, ("valid", 256): 24.9, ("valid", 512): 26.7,
                  ("test", 64): 24.4, ("test", 256): 25.3, ("test", 512): 27.7},
    "DPFP": {("valid", 256): 26.2, ("valid", 512): 26.2, ("test", 256): 26.9, ("test", 512): 27.1},
}


def read_configs(config_dir):
    """{config name: (row, d_dot)} for every config that declares its Table 1 cell."""
    cells = {}
    for path in sorted(Path(config_dir).glob("*.sh")):
        source = path.read_text()
        row = re.search(r'^TABLE1_ROW="([^"]+)"', source, re.M)
        ddot = re.search(r"^TABLE1_DDOT=(\d+)", source, re.M)
        if row and ddot:
            cells[path.stem] = (row.group(1), int(ddot.group(1)))
    return cells


def read_results(results_dir, checkpoint):
    """The newest result per (config, subset) among JSONs of the given checkpoint file name."""
    found = {}
    for path in sorted(Path(results_dir).rglob("*.json"), key=lambda p: p.stat().st_mtime):
        try:
            result = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(result, dict) or not {"config", "subset", "checkpoint"} <= result.keys():
            continue
        if Path(result["checkpoint"]).name == checkpoint:
            found[result["config"], result["subset"]] = result
    return found


def fmt(value):
    return "–" if value is None else f"{value:.1f}"


def render(cells, results, metric):
    expected = set(cells.values())  # cells some config of ours is meant to fill
    ours = {}
    for (config, subset), result in results.items():
        if config in cells and subset in SUBSETS:
            row, ddot = cells[config]
            ours[row, subset, ddot] = result.get(metric)
    rows = [r for r in ROW_ORDER if r in PAPER or any(cell[0] == r for cell in expected)]
    rows += sorted({cell[0] for cell in expected} - set(rows))
    header = ["Model"] + [f"{s} d_dot={d}" for s in SUBSETS for d in DDOTS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cols = [row if row in PAPER else f"{row} (beyond the paper)"]  # a row the paper has no number for
        for subset in SUBSETS:
            for ddot in DDOTS:
                mine, paper = ours.get((row, subset, ddot)), PAPER.get(row, {}).get((subset, ddot))
                shown = paper is not None or (row, ddot) in expected
                cols.append(f"{fmt(mine)} ({fmt(paper)})" if shown else "")
        lines.append("| " + " | ".join(cols) + " |")
    name = METRICS[metric]
    signatures = sorted({r.get("sacrebleu_signature") for r in results.values() if r.get("sacrebleu_signature")})
    notes = [f"WMT14 En-De, valid = newstest2013, test = newstest2014; cells: ours (paper), {name}.",
             "Paper numbers: Schlag, Irie & Schmidhuber (2021), Table 1 (no checkpoint averaging, no per-model tuning)."]
    if metric == "sacrebleu" and signatures:
        notes.append("sacreBLEU signature: " + "; ".join(signatures))
    missing = sorted(c for c in cells if not any((c, s) in results for s in SUBSETS))
    if missing:
        notes.append("No results yet for: " + ", ".join(missing))
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(REPO / "work" / "results" / "wmt14_en_de"),
                   help="directory searched (recursively) for evaluate.sh's JSON files")
    p.add_argument("--configs", default=str(REPO / "configs" / "wmt14_en_de"))
    p.add_argument("--checkpoint", default="checkpoint_best.pt", help="file name of the checkpoints to report")
    p.add_argument("--metric", choices=tuple(METRICS), default="sacrebleu")
    p.add_argument("--output", help="write the Markdown here instead of stdout")
    args = p.parse_args(argv)

    table = render(read_configs(args.configs), read_results(args.results, args.checkpoint), args.metric)
    if args.output:
        Path(args.output).write_text(table, encoding="utf-8")
    else:
        sys.stdout.write(table)


if __name__ == "__main__":
    main()
