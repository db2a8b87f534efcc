"""Offline demo: character-level language models on the licence texts every Debian machine has.

The corpus is real English: /usr/share/common-licenses/* (GPL, LGPL, Apache, MPL, ...), one line
per text line, characters as tokens ("▁" for a space). Three models of the same size train for
a fixed few minutes each on 2 CPU cores and are compared side by side:

  softmax          fairseq's transformer_lm (the standard Transformer)
  delta-dpfp       transformer_lm_fw: DPFP-1 fast weights with the delta rule
  feedback         feedback_transformer_lm (every layer reads a memory of all layers' past outputs)

  1. corpus   unique licence files, lines deduplicated, split train / valid / test by line
  2. binarise fairseq-preprocess --only-source
  3. train    fairseq-train --task language_modeling --user-dir fw_fairseq, fixed minutes each
  4. score    fairseq-eval-lm on the test split (perplexity per character) and a sampled text
              from fairseq-interactive

    python -m fw_research.demo.lm_demo [--minutes 3.5] [--work-dir lm_demo_work]
"""
import argparse
import json
import math
import random
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
LICENSES = Path("/usr/share/common-licenses")
SPACE = "\u2581"
SHAPE = ["--decoder-layers", "2", "--decoder-embed-dim", "128", "--decoder-attention-heads", "4",
         "--decoder-ffn-embed-dim", "512"]
MODELS = {
    "softmax": ["--arch", "transformer_lm", *SHAPE],
    "delta-dpfp": ["--arch", "transformer_lm_fw_tiny", *SHAPE, "--fw-feature-map", "dpfp",
                   "--fw-dpfp-nu", "1", "--fw-update-rule", "delta"],
    "feedback": ["--arch", "feedback_transformer_lm_tiny", *SHAPE],
}
TOKENS_PER_SAMPLE = 128
TRAIN = ["--task", "language_modeling", "--sample-break-mode", "none",
         "--tokens-per-sample", str(TOKENS_PER_SAMPLE), "--optimizer", "adam",
         "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
         "--warmup-updates", "100", "--clip-norm", "1.0", "--dropout", "0.1",
         "--batch-size", "16", "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints",
         "--disable-validation", "--log-format", "simple", "--log-interval", "25",
         "--required-batch-size-multiple", "1"]
STEPS = 4


def say(step, text):
    print(f"[{step}/{STEPS}] {text}", flush=True)


def run(args, log=None, stdin=None):
    """Run a CLI; write its log to `log` and stop with its tail if it fails."""
    with open(log or "/dev/null", "w") as sink:
        proc = subprocess.run([str(a) for a in args], stdout=sink, stderr=subprocess.STDOUT,
                              input=stdin, text=True)
    if proc.returncode != 0:
        tail = Path(log).read_text()[-3000:] if log else ""
        sys.exit(f"lm_demo: {Path(str(args[0])).name} failed (exit {proc.returncode})\n{tail}")


def to_chars(line):
    """'GNU General' -> 'G N U ▁ G e n e r a l' (fairseq's dictionary splits on whitespace)."""
    return " ".join(SPACE if c == " " else c for c in " ".join(line.split()))


def from_chars(tokens):
    return "".join(" " if t == SPACE else t for t in tokens.split())


def licence_lines(directory=LICENSES):
    """Unique non-empty lines of the unique licence files (GPL is a link to GPL-3, ...)."""
    files = sorted({p.resolve() for p in directory.iterdir() if p.is_file()})
    seen, lines = set(), []
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            line = " ".join(line.split())
            if len(line) >= 20 and line not in seen:
                seen.add(line)
                lines.append(line)
    return lines


def make_corpus(raw, held_out=0.05, max_lines=None, seed=0):
    """Write raw/{train,valid,test}.txt (character tokens); returns the line counts."""
    lines = licence_lines()[:max_lines]
    random.Random(seed).shuffle(lines)
    n = max(1, int(len(lines) * held_out))
    splits = {"valid": lines[:n], "test": lines[n: 2 * n], "train": lines[2 * n:]}
    raw.mkdir(parents=True, exist_ok=True)
    for split, part in splits.items():
        (raw / f"{split}.txt").write_text("".join(to_chars(l) + "\n" for l in part))
    return {split: len(part) for split, part in splits.items()}


def binarise(raw, dest, log=None):
    run([BIN / "fairseq-preprocess", "--only-source", "--trainpref", raw / "train.txt",
         "--validpref", raw / "valid.txt", "--testpref", raw / "test.txt", "--destdir", dest,
         "--workers", "1"], log=log)


def train(work, name, minutes):
    save = work / "checkpoints" / name
    log = work / f"train.{name}.log"
    run([BIN / "fairseq-train", work / "data-bin", "--user-dir", REPO / "fw_fairseq",
         *MODELS[name], *TRAIN, "--save-dir", save, "--stop-time-hours", minutes / 60], log=log)
    updates = re.findall(r"num_updates[ =]+(\d+)", log.read_text())
    return save / "checkpoint_last.pt", int(updates[-1]) if updates else 0


def evaluate(work, name, checkpoint):
    """Test perplexity per character from fairseq-eval-lm (base 2 loss -> perplexity)."""
    log = work / f"eval.{name}.log"
    run([BIN / "fairseq-eval-lm", work / "data-bin", "--user-dir", REPO / "fw_fairseq",
         "--path", checkpoint, "--gen-subset", "test", "--sample-break-mode", "none",
         "--tokens-per-sample", str(TOKENS_PER_SAMPLE), "--batch-size", "16",
         "--required-batch-size-multiple", "1", "--num-workers", "0"], log=log)
    loss = float(re.findall(r"Loss \(base 2\): ([0-9.]+)", log.read_text())[-1])
    return round(2 ** loss, 3)


def sample(work, name, checkpoint, prompt="This License", length=60):
    """A sampled continuation of `prompt`. fw_lm_stream builds the prompt like language_modeling
    does, avoiding fairseq's TokenBlockDataset code that numpy 2 broke (np.compat)."""
    log = work / f"sample.{name}.log"
    run([BIN / "fairseq-interactive", work / "data-bin", "--user-dir", REPO / "fw_fairseq",
         "--task", "fw_lm_stream", "--path", checkpoint, "--sampling", "--sampling-topk",
         "5", "--seed", "1", "--beam", "1", "--max-len-b", str(length), "--min-len", str(length),
         "--required-batch-size-multiple", "1"], log=log, stdin=to_chars(prompt) + "\n")
    hypo = re.findall(r"^H-\d+\t\S+\t(.*)$", log.read_text(), flags=re.M)[-1]
    return from_chars(hypo)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.5, help="training time per model")
    parser.add_argument("--work-dir", type=Path, default=REPO / "lm_demo_work")
    parser.add_argument("--results", type=Path, default=REPO / "results" / "lm_demo")
    args = parser.parse_args()
    work, start = args.work_dir, time.time()
    sizes = make_corpus(work / "raw")
    say(1, f"corpus: {sizes} lines of {LICENSES}/*")
    if not (work / "data-bin/dict.txt").exists():
        binarise(work / "raw", work / "data-bin", log=work / "preprocess.log")
    say(2, "fairseq-preprocess --only-source done")

    results = {}
    for name in MODELS:
        say(3, f"training {name} for {args.minutes:g} min (log: {work / f'train.{name}.log'})")
        checkpoint, updates = train(work, name, args.minutes)
        ppl = evaluate(work, name, checkpoint)
        results[name] = {"flags": " ".join(MODELS[name]), "updates": updates,
                         "test_ppl_per_char": ppl, "sample": sample(work, name, checkpoint)}
        say(4, f"{name}: {updates} updates, test perplexity {ppl:.3f} per character")

    print(f"\nCharacter-level LM on {LICENSES}, {args.minutes:g} min of 2-core CPU training each")
    print("| model | updates | test ppl/char | bits/char |\n|---|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['updates']} | {r['test_ppl_per_char']:.3f} | "
              f"{math.log2(r['test_ppl_per_char']):.3f} |")
    print("\nSamples (prompt 'This License', top-5 sampling):")
    for name, r in results.items():
        print(f"  {name:11s} {r['sample']!r}")
    args.results.mkdir(parents=True, exist_ok=True)
    summary = {"minutes_per_model": args.minutes, "corpus_lines": sizes,
               "tokens_per_sample": TOKENS_PER_SAMPLE, "wall_minutes":
               round((time.time() - start) / 60, 1), "models": results}
    (args.results / "results.json").write_text(json.dumps(summary, ensure_ascii=False, indent=1))
    print(f"\nwritten: {args.results / 'results.json'}")


if __name__ == "__main__":
    main()
