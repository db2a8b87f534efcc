#!/usr/bin/env python3
"""The paper's Table 1 (WMT14 En-De) in one command: every row trained, scored and tabled beside the paper.

    scripts/wmt14/table1.sh --dry-run                          # every command, the disk space, the expected GPU-hours
    scripts/wmt14/table1.sh --gpus 3                           # every row, one after another, 3 GPUs each (the paper's)
    scripts/wmt14/table1.sh --gpus 6 --rows dpfp_nu2,linear    # two rows side by side, 3 GPUs each

Steps: the data (fw_research.wmt14.prepare_wmt14_en_de) where DATA_BIN holds none; for each row (a config of
configs/wmt14_en_de/ that names its Table 1 cell) scripts/wmt14/train.sh, which resumes from checkpoint_last.pt, then
scripts/wmt14/evaluate.sh on valid and test with checkpoint_best.pt (selected by validation BLEU during training, as the
paper did: no averaging); last the table (fw_research.wmt14.table1) in both metrics with each row's wall time and
GPU-hours, printed and written to RESULTS_DIR/table1.md. A row whose training finished (its marker
SAVE_ROOT/<row>/trained.json) is not trained again, a score already written is not computed again: re-running the
same command continues where it stopped. Rows run side by side where --gpus holds more than one row's
--gpus-per-row; every row keeps the paper's 48 batches per update (train.sh). Paths: DATA_BIN, SAVE_ROOT,
RESULTS_DIR as configs/wmt14_en_de/common.sh reads them, or --data, --save-root, --results.
"""
import argparse
import json
import os
import queue
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from fw_research.wmt14 import table1, table1_cost

REPO = Path(__file__).resolve().parents[3]
SCRIPTS = REPO / "scripts" / "wmt14"  # train.sh, evaluate.sh
PREPARE = [sys.executable, "-m", "fw_research.wmt14.prepare_wmt14_en_de"]
CONFIGS = REPO / "configs" / "wmt14_en_de"
WORK = REPO / "work"
PAPER_BATCHES_PER_UPDATE = 48  # configs/wmt14_en_de/common.sh: 3 GPUs x 16 accumulated batches


def arguments(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", help="comma-separated configs of configs/wmt14_en_de/ (default: every Table 1 row)")
    p.add_argument("--gpus", type=int, default=3, help="GPUs to use in all (0: the CPU, for a rehearsal)")
    p.add_argument("--gpus-per-row", type=int, help="GPUs a row trains on (default: min(--gpus, 3), the paper's 3)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, its disk space and GPU-hours; run nothing")
    p.add_argument("--data", default=os.environ.get("DATA_BIN", str(WORK / "wmt14_en_de/data-bin/bpe32000")))
    p.add_argument("--save-root", default=os.environ.get("SAVE_ROOT", str(WORK / "checkpoints/wmt14_en_de")))
    p.add_argument("--results", default=os.environ.get("RESULTS_DIR", str(WORK / "results/wmt14_en_de")))
    p.add_argument("--train-args", default="", help="extra fairseq-train arguments for every row (they win)")
    p.add_argument("--generate-args", default="", help="extra fairseq-generate arguments for every score")
    args = p.parse_args(argv)
    cells = table1.read_configs(CONFIGS)
    rows = args.rows.split(",") if args.rows else list(cells)
    unknown = [row for row in rows if row not in cells]
    if unknown:
        p.error(f"--rows: {', '.join(unknown)} is not a Table 1 config; allowed: {', '.join(cells)}")
    per_row = args.gpus_per_row or min(args.gpus, 3)
    if args.gpus < 0 or (args.gpus and not 1 <= per_row <= args.gpus):
        p.error(f"--gpus {args.gpus} --gpus-per-row {per_row}: a row needs 1..--gpus GPUs")
    if per_row and PAPER_BATCHES_PER_UPDATE % per_row:
        allowed = [n for n in range(1, PAPER_BATCHES_PER_UPDATE + 1) if PAPER_BATCHES_PER_UPDATE % n == 0]
        p.error(f"--gpus-per-row {per_row} cannot keep the paper's {PAPER_BATCHES_PER_UPDATE} batches per update; "
                f"allowed: {', '.join(map(str, allowed))}")
    args.rows, args.per_row, args.cells = rows, per_row, cells
    return args


def commands(args, row):
    """The row's commands: train, then score valid and test with its best checkpoint."""
    best = Path(args.save_root) / row / "checkpoint_best.pt"
    train = [str(SCRIPTS / "train.sh"), row, *shlex.split(args.train_args)]
    scores = [[str(SCRIPTS / "evaluate.sh"), str(best), "--subset", subset, "--name", row, "--out-dir",
               str(Path(args.results) / row), "--", *shlex.split(args.generate_args)] for subset in table1.SUBSETS]
    return train, scores


def environment(args, devices):
    env = dict(os.environ, DATA_BIN=args.data, SAVE_ROOT=args.save_root, RESULTS_DIR=args.results)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))  # "" on the CPU: no GPU seen
    return env


def run_row(args, row, devices):
    """Train the row (unless its marker says it is done) and score it (unless already scored)."""
    env = environment(args, devices)
    train, scores = commands(args, row)
    marker = Path(args.save_root) / row / "trained.json"
    if not marker.exists():
        start = time.monotonic()
        subprocess.run(train, env=env, check=True)
        marker.write_text(json.dumps({"seconds": round(time.monotonic() - start, 1), "gpus": len(devices)}) + "\n")
    for command, subset in zip(scores, table1.SUBSETS):
        if not (Path(args.results) / row / f"checkpoint_best.{subset}.json").exists():
            subprocess.run(command, env=env, check=True)
    return row


def run_rows(args):
    """Every row, as many side by side as the GPUs hold, each on its own slice of them."""
    slices = queue.Queue()
    for i in range(max(1, args.gpus // args.per_row) if args.gpus else 1):
        slices.put(list(range(i * args.per_row, (i + 1) * args.per_row)))

    def one(row):
        devices = slices.get()
        try:
            return run_row(args, row, devices)
        finally:
            slices.put(devices)

    with ThreadPoolExecutor(max_workers=slices.qsize()) as pool:
        for row in pool.map(one, args.rows):
            print(f"table1: {row} done", file=sys.stderr)


def report(args):
    """The table in both metrics, with each row's time and GPU-hours: printed and written to table1.md."""
    cells = {row: args.cells[row] for row in args.rows}
    results = table1.read_results(args.results, "checkpoint_best.pt")
    text = "\n".join(table1.render(cells, results, metric) for metric in ("sacrebleu", "tok_bleu"))
    text += "\n" + table1_cost.spent(args.save_root, args.rows)
    Path(args.results).mkdir(parents=True, exist_ok=True)
    (Path(args.results) / "table1.md").write_text(text, encoding="utf-8")
    print(text)


def prepare_data(args):
    if not (Path(args.data) / "wmt_prep.json").exists():
        subprocess.run([*PREPARE, "--dest-dir", args.data], check=True)


def dry_run(args):
    if not (Path(args.data) / "wmt_prep.json").exists():
        print(shlex.join([*PREPARE, "--dest-dir", args.data]))
    paths = f"DATA_BIN={shlex.quote(args.data)} SAVE_ROOT={shlex.quote(args.save_root)} " \
            f"RESULTS_DIR={shlex.quote(args.results)}"
    for i, row in enumerate(args.rows):
        side = i % max(1, args.gpus // args.per_row) if args.gpus else 0
        devices = ",".join(map(str, range(side * args.per_row, (side + 1) * args.per_row)))
        train, scores = commands(args, row)
        for command in (train, *scores):
            print(f"{paths} CUDA_VISIBLE_DEVICES={devices or chr(34) * 2} {shlex.join(command)}")
    print()
    print(table1_cost.plan(args.data, args.rows, args.per_row or 1))


def main(argv=None):
    args = arguments(argv)
    if args.dry_run:
        dry_run(args)
        return
    prepare_data(args)
    run_rows(args)
    report(args)


if __name__ == "__main__":
    main()
