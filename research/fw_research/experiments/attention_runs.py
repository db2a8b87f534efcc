"""One model of an attention comparison: fairseq-train for a fixed number of updates, with a progress bar
and a validation-loss curve, then fairseq-generate on the test split and sacreBLEU (and, where asked, the
--lenpen that translates the valid split best, then the test split with it), and the lengths of its
translations (length_profile: BLEU and length by source length, repetition loops, outputs over twice their
reference) on the test split and on the long split (test_long) where the work directory has one.

A fixed number of updates (not a time budget) makes the result the same on a slow or busy machine as on
a quiet one: only the wall time changes. Used by fw_research.demo.compare_attention and fw_research.demo.demo.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from sacremoses import MosesDetokenizer

from fw_research.experiments.translation_lengths import length_profile, loops, loops_in_words_only, over_twice_in_tokens

REPO = Path(__file__).resolve().parents[3]
BAR = 30  # characters of the progress bar


def fairseq_cli(name):
    """fairseq-`name` (train, generate) as a module of this interpreter: the console script's own entry point, also
    where fairseq runs from its source tree without installed scripts (an offline GPU node, docs/gpu_node.md)."""
    return [sys.executable, "-m", f"fairseq_cli.{name}"]


class Progress:
    """`label [#####.....] 120/600 updates` on one terminal line (a line per tenth when not a terminal)."""

    def __init__(self, label, total, stream=None):
        self.label, self.total, self.stream = label, total, stream or sys.stdout
        self.tty = self.stream.isatty()
        self.shown, self.start = -1, time.time()

    def update(self, done):
        done = min(done, self.total)
        step = done * BAR // self.total if self.tty else done * 10 // self.total
        if step == self.shown:
            return
        self.shown = step
        filled = done * BAR // self.total
        line = (f"  {self.label:<28} [{'#' * filled}{'.' * (BAR - filled)}] {done}/{self.total} updates "
                f"{time.time() - self.start:5.0f} s")
        self.stream.write(("\r" + line) if self.tty else line + "\n")
        if self.tty and done == self.total:
            self.stream.write("\n")
        self.stream.flush()


def _json_record(line, tag):
    """The dict fairseq's --log-format json prints after `| {tag} |`, or None."""
    marker = f"| {tag} | "
    return json.loads(line.split(marker, 1)[1]) if marker in line else None


def _environment(threads, **extra):
    """A fairseq CLI's environment: this one with `extra`, and OMP_NUM_THREADS `threads` where given (else torch's
    default)."""
    return dict(os.environ, **extra, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))


def train(data, save_dir, flags, updates, valid_every, log, label, threads=None):
    """fairseq-train `flags` for exactly `updates` updates (resuming from save_dir's checkpoint_last.pt
    if a previous run was cut off), validating every `valid_every` updates. Returns the run's record:
    the valid-loss curve [(updates, loss)], the seconds per training update (without start-up,
    validation and checkpoints) and the checkpoint."""
    checkpoint = str(Path(save_dir) / "checkpoint_last.pt")
    if updates_done(save_dir) >= updates:
        # fairseq-train takes one more update before it checks --max-update, so a finished run is not resumed
        Progress(label, updates).update(updates)
        return {"updates": updates, "curve": sorted(_resumed_curve(log).items()), "seconds_per_update": None,
                "checkpoint": checkpoint}
    args = [*fairseq_cli("train"), data, "--user-dir", REPO / "fw_fairseq", *flags,
            "--max-update", updates, "--validate-interval-updates", valid_every,
            # a log interval dividing the validation interval leaves intervals with nothing else in them
            "--log-format", "json", "--log-interval", max(1, min(10, valid_every // 2)),
            "--save-dir", save_dir, "--no-epoch-checkpoints", "--num-workers", "0",
            "--required-batch-size-multiple", "1"]
    # unbuffered: the log lines (and so the progress bar and the timing) arrive as fairseq prints them
    env = _environment(threads, PYTHONUNBUFFERED="1")
    progress, curve = Progress(label, updates), {}
    # Time per update from the arrival of consecutive train_inner lines; an interval in which anything
    # else was printed (validation, a checkpoint, a new epoch) is not counted.
    previous, clean, seconds, counted = None, False, 0.0, 0
    # line-buffered, so that the log can be followed (tail -f) while the model trains
    with open(log, "a", buffering=1) as sink:
        proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env)
        for line in proc.stdout:
            sink.write(line)
            inner, now = _json_record(line, "train_inner"), time.time()
            if inner:
                done = int(inner["num_updates"])
                if previous and clean:
                    seconds, counted = seconds + now - previous[1], counted + done - previous[0]
                previous, clean = (done, now), True
                progress.update(done)
                continue
            clean = False
            valid = _json_record(line, "valid")
            if valid:
                curve[int(valid["valid_num_updates"])] = float(valid["valid_loss"])
        proc.wait()
    if proc.returncode != 0:
        sys.exit(f"{label}: fairseq-train failed (exit {proc.returncode}); its log: {log}")
    progress.update(updates)
    curve = {**_resumed_curve(log), **curve}  # with the points logged before an interruption
    return {"updates": updates, "curve": sorted(curve.items()),
            "seconds_per_update": round(seconds / counted, 4) if counted else None,
            "checkpoint": checkpoint}


def updates_done(save_dir):
    """The updates in save_dir's checkpoint_last.pt (0 without one)."""
    last = Path(save_dir) / "checkpoint_last.pt"
    if not last.is_file():
        return 0
    return torch.load(last, map_location="cpu", weights_only=False)["optimizer_history"][-1]["num_updates"]


def _resumed_curve(log):
    """Every valid point in the (appended) log, so that a resumed run keeps its earlier curve."""
    points = {}
    for line in Path(log).read_text().splitlines():
        valid = _json_record(line, "valid")
        if valid:
            points[int(valid["valid_num_updates"])] = float(valid["valid_loss"])
    return points


LENPEN = 0.6  # fairseq-generate's --lenpen for every model (the WMT recipe's), unless tune_lenpen picks one
# fairseq-generate's --max-len-a and --max-len-b: catalog messages are short, so a rambling hypothesis stops at
# 1.2 x source + 10 tokens
MAX_LEN_A, MAX_LEN_B = 1.2, 10


def length_limit(source_tokens):
    """The most tokens fairseq-generate gives a translation of a source of `source_tokens` subword tokens (its end of
    sentence counted), the end of sentence not counted: it forces the end of sentence after them."""
    return int(MAX_LEN_A * source_tokens + MAX_LEN_B)


def translate(data, checkpoint, out, subset="test", lenpen=LENPEN, threads=None, extra=()):
    """fairseq-generate (beam 4) on a split (torch threads: `threads`, else torch's default; `extra`: more
    fairseq-generate flags); returns the detokenised hypotheses in the split's order."""
    args = [*fairseq_cli("generate"), data, "--user-dir", REPO / "fw_fairseq", "--path", checkpoint,
            "--gen-subset", subset, "--beam", "4", "--lenpen", str(lenpen), "--batch-size", "64",
            "--required-batch-size-multiple", "1", "--remove-bpe",
            "--max-len-a", MAX_LEN_A, "--max-len-b", MAX_LEN_B, *extra]
    with open(out, "w") as sink:
        proc = subprocess.run([str(a) for a in args], stdout=sink, stderr=subprocess.STDOUT, env=_environment(threads))
    if proc.returncode != 0:
        sys.exit(f"fairseq-generate failed (exit {proc.returncode}); its log: {out}")
    hyps = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", Path(out).read_text(), flags=re.M))
    detok = MosesDetokenizer(lang="de")
    return [detok.detokenize(hyps[str(i)].split()) for i in range(len(hyps))]


def at_length_limit(generate_out, data, subset):
    """The ids of the translations in fairseq-generate's output `generate_out` (of `subset` of the data-bin `data`)
    that ran to their own source's length_limit, where generation cuts a translation that has not ended.
    fairseq sets one limit per batch, its longest source's; a translation that passed its own limit and ended below
    its batch's is counted too."""
    # fairseq takes seconds to import, and only this count reads its binarised data
    from fairseq.data import indexed_dataset
    # one size per sentence, its end of sentence included: the src_tokens length fairseq's limit is taken from
    dataset = indexed_dataset.make_dataset(str(Path(data) / f"{subset}.en-de.en"), impl="mmap")
    sources = dataset.sizes.tolist()  # a copy: the sizes are a view of the file, unmapped with the dataset
    # P-{id}: a score per generated token, the end of sentence included
    scores = re.findall(r"^P-(\d+)\t(.*)$", Path(generate_out).read_text(), flags=re.M)
    return sorted(int(i) for i, tokens in scores if len(tokens.split()) - 1 >= length_limit(sources[int(i)]))


def score(hypotheses, references):
    """Detokenised corpus sacreBLEU and its signature, with its brevity penalty, the hypotheses' length over the
    references' and the 1- to 4-gram precisions (sacreBLEU's 13a tokens): whether a BLEU difference is the n-grams'
    or the length's."""
    metric = sacrebleu.BLEU()
    result = metric.corpus_score(hypotheses, [references])
    return {"bleu": round(result.score, 2), "signature": str(metric.get_signature()), "bp": round(result.bp, 4),
            "length_ratio": round(result.sys_len / result.ref_len, 4),
            "precisions": [round(p, 2) for p in result.precisions]}


def has_long_split(work):
    return (Path(work) / "data-bin/test_long.en-de.de.idx").is_file()


def _kept_parts(work, name, record):
    """(profile, hypotheses or None, its fairseq-generate output, split) of the record's test and long split."""
    return [(part["profile"], part.get("hypotheses"), work / f"generate.{name}{suffix}.txt", split)
            for part, suffix, split in ((record, "", "test"), (record.get("long"), ".test_long", "test_long"))
            if part and "profile" in part]


def _add_counts(work, name, record):
    """Adds to the record's profiles the counts made after them, where the record kept their translations and the
    work directory their fairseq-generate output: over_twice_in_tokens, the loops inside a word only
    (loops_in_words_only), the translations at the length limit and how many of them loop. Whether it added one."""
    changed = False
    for profile, hypotheses, out, split in _kept_parts(work, name, record):
        if hypotheses is not None and "over_twice_tokens" not in profile:
            references = (work / f"raw/{split}.de").read_text().splitlines()
            profile["over_twice_tokens"] = over_twice_in_tokens(hypotheses, references)
            changed = True
        if hypotheses is not None and "loops_in_words" not in profile:
            profile["loops_in_words"], changed = loops_in_words_only(hypotheses), True
        if out.is_file() and ("at_limit" not in profile or hypotheses is not None and "at_limit_loops" not in profile):
            ids = at_length_limit(out, work / "data-bin", split)
            profile["at_limit"], changed = len(ids), True
            if hypotheses is not None:
                profile["at_limit_loops"] = sum(loops(hypotheses[i]) for i in ids)
    return changed


def measure_lengths(work, name, threads=None, checkpoint=None):
    """The run's record with "profile" (length_profile of its test translations, where raw/ has their sources) and,
    where the work directory has the long split, "long": test_long translated (beam 4, --lenpen LENPEN), score()
    and length_profile() of it, and its hypotheses. Adds them to records made before they existed (translating
    test_long from the run's checkpoint), and the counts made after them to profiles without them (_add_counts); a
    record that has them all is returned as it is."""
    work = Path(work)
    record_file = work / "runs" / f"{name}.json"
    record = json.loads(record_file.read_text())
    changed = False
    if "profile" not in record and (work / "raw/test.en").is_file():  # a work dir with its sources
        sources, references = ((work / f"raw/test.{lang}").read_text().splitlines() for lang in ("en", "de"))
        record["profile"], changed = length_profile(record["hypotheses"], references, sources), True
    if "long" not in record and has_long_split(work):
        checkpoint = checkpoint or work / "checkpoints" / name / "checkpoint_last.pt"
        if not Path(checkpoint).is_file():
            sys.exit(f"{checkpoint} is missing: the long split needs each run's checkpoint in --work-dir")
        sources, references = ((work / f"raw/test_long.{lang}").read_text().splitlines() for lang in ("en", "de"))
        hypotheses = translate(work / "data-bin", checkpoint, work / f"generate.{name}.test_long.txt", "test_long",
                               threads=threads)
        record["long"] = {**score(hypotheses, references), "profile": length_profile(hypotheses, references, sources),
                          "hypotheses": hypotheses}
        changed = True
    changed = _add_counts(work, name, record) or changed
    if changed:
        record_file.write_text(json.dumps(record, ensure_ascii=False, indent=1))
    return record


def tune_lenpen(work, name, grid, threads=None):
    """The run's record with "tuned": the --lenpen of `grid` with the best BLEU on the valid split (the first of
    equals), and test score() with it; the valid split only picks it. Adds the lengths and precisions of the test
    hypotheses at LENPEN to a record made before train_and_score kept them. Kept in the record: a re-run with the
    same grid translates nothing."""
    record_file = work / "runs" / f"{name}.json"
    record = json.loads(record_file.read_text())
    grid = sorted(set(grid))
    references = {split: (work / f"raw/{split}.de").read_text().splitlines() for split in ("valid", "test")}
    if "precisions" not in record:
        record.update(score(record["hypotheses"], references["test"]))
    if record.get("tuned", {}).get("grid") == grid:
        record_file.write_text(json.dumps(record, ensure_ascii=False, indent=1))
        return record
    checkpoint = work / "checkpoints" / name / "checkpoint_last.pt"
    if not checkpoint.is_file():
        sys.exit(f"{checkpoint} is missing: --lenpen-grid needs each run's checkpoint in --work-dir")
    # --score-valid's BLEU on valid was taken at LENPEN: that point of the grid is not translated again
    known = {LENPEN: record["valid_bleu"]["valid"]} if "valid" in record.get("valid_bleu", {}) else {}
    valid = {lenpen: known[lenpen] if lenpen in known else score(translate(
        work / "data-bin", checkpoint, work / f"generate.{name}.valid.lp{lenpen}.txt", "valid", lenpen, threads),
        references["valid"])["bleu"] for lenpen in grid}
    best = max(grid, key=lambda lenpen: (valid[lenpen], -grid.index(lenpen)))
    hypotheses = record["hypotheses"] if best == LENPEN else translate(
        work / "data-bin", checkpoint, work / f"generate.{name}.lp{best}.txt", "test", best, threads)
    record["tuned"] = {"grid": grid, "valid_bleu": {str(k): v for k, v in valid.items()}, "lenpen": best,
                       **score(hypotheses, references["test"])}
    record_file.write_text(json.dumps(record, ensure_ascii=False, indent=1))
    return record


def run_name(config, seed, updates):
    """A run's name in a work directory: its checkpoints/NAME, runs/NAME.json, train.NAME.log and generate.NAME.txt."""
    return f"{config}.s{seed}.u{updates}"


def train_and_score(work, name, flags, updates, valid_every, label=None, threads=None):
    """One model end to end, or its stored record if `work/runs/{name}.json` exists (re-runs continue)."""
    record_file = work / "runs" / f"{name}.json"
    if record_file.exists():
        return json.loads(record_file.read_text())
    record_file.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    record = train(work / "data-bin", work / "checkpoints" / name, flags, updates, valid_every,
                   work / f"train.{name}.log", label or name, threads)
    checkpoint = record.pop("checkpoint")
    hypotheses = translate(work / "data-bin", checkpoint, work / f"generate.{name}.txt", threads=threads)
    references = (work / "raw/test.de").read_text().splitlines()
    record.update(score(hypotheses, references))
    record.update(flags=[str(f) for f in flags], wall_seconds=round(time.time() - start, 1),
                  hypotheses=hypotheses)
    record_file.write_text(json.dumps(record, ensure_ascii=False, indent=1))
    return measure_lengths(work, name, threads, checkpoint)
