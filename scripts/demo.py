"""Offline demo: English -> German translation with fast weight Transformers, on 2 CPU cores.

The corpus is real parallel text that every Debian machine carries: the German message catalogs
under /usr/share/locale/de/LC_MESSAGES (English msgid -> German msgstr, read with gettext).
The demo runs the same pipeline as the WMT14 scripts, end to end:

  1. corpus   pairs from the .mo files, deduplicated, split into train / valid / test
  2. subwords sacremoses tokenisation + joint BPE (subword-nmt), fairseq-preprocess
  3. train    fairseq-train --user-dir fw_fairseq for a fixed few minutes per model:
              softmax (standard Transformer), DPFP sum rule, DPFP delta rule
  4. score    fairseq-generate (beam 4), detokenise, sacrebleu on the held-out test split

Finished steps are skipped when re-run (delete --work-dir to start over).

    python scripts/demo.py [--minutes 3] [--work-dir demo_work]
"""
import argparse
import gettext
import json
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import sacrebleu
from sacremoses import MosesDetokenizer, MosesTokenizer

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
LOCALE_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
MODELS = {
    "softmax": ["--fw-attention", "none"],
    "dpfp-sum": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "1", "--fw-update-rule", "sum"],
    "dpfp-delta": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "1", "--fw-update-rule", "delta"],
}
# Small enough for a few hundred updates per model in minutes on 2 cores; d_key stays 64.
ARCH = ["--arch", "transformer_fw_small", "--share-all-embeddings",
        "--encoder-layers", "2", "--decoder-layers", "2",
        "--encoder-embed-dim", "128", "--decoder-embed-dim", "128",
        "--encoder-ffn-embed-dim", "512", "--decoder-ffn-embed-dim", "512",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]
TRAIN = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3",
         "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "200", "--clip-norm", "1.0",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--dropout", "0.1", "--max-tokens", "2048", "--seed", "1", "--num-workers", "0",
         "--no-epoch-checkpoints", "--disable-validation", "--log-format", "simple",
         "--log-interval", "50", "--required-batch-size-multiple", "1"]
STEPS = 4


def say(step, text):
    print(f"[{step}/{STEPS}] {text}", flush=True)


def run(args, log=None):
    """Run a CLI; stream its log to `log` and stop with its tail if it fails."""
    with open(log or "/dev/null", "w") as sink:
        proc = subprocess.run([str(a) for a in args], stdout=sink, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = Path(log).read_text()[-3000:] if log else ""
        sys.exit(f"demo: {Path(str(args[0])).name} failed (exit {proc.returncode})\n{tail}")


def clean_message(text):
    """A catalog message as a plain sentence: no accelerator markers, one line."""
    text = re.sub(r"[_&](?=\w)", "", text)  # GTK/Qt mnemonics: "_Open" -> "Open"
    return " ".join(text.split())


def catalog_pairs(locale_dir):
    """(English, German) message pairs of every .mo catalog, singular messages only."""
    pairs = {}
    for mo in sorted(locale_dir.glob("*.mo")):
        try:
            with open(mo, "rb") as fp:
                catalog = gettext.GNUTranslations(fp)._catalog  # gettext keeps the pairs here
        except (OSError, UnicodeDecodeError):
            continue  # a few old catalogs are in a legacy charset: skip them
        for msgid, msgstr in catalog.items():
            if not isinstance(msgid, str) or not msgid or "\n" in msgid.strip():
                continue  # plural forms are keyed by tuples; "" is the header
            msgid = msgid.split("\x04", 1)[-1]  # drop a msgctxt ("context\x04message")
            en, de = clean_message(msgid), clean_message(msgstr)
            if en and de and en != de and 2 <= len(en.split()) <= 12 and len(de.split()) <= 16:
                pairs.setdefault(en, de)
    return sorted(pairs.items())


def make_corpus(work, test_size):
    if not LOCALE_DIR.is_dir() or not any(LOCALE_DIR.glob("*.mo")):
        sys.exit(f"demo: no German message catalogs in {LOCALE_DIR}; install some (e.g. "
                 "`apt-get install coreutils` ships de/LC_MESSAGES/coreutils.mo) and re-run")
    pairs = catalog_pairs(LOCALE_DIR)
    random.Random(0).shuffle(pairs)
    splits = {"test": pairs[:test_size], "valid": pairs[test_size:2 * test_size],
              "train": pairs[2 * test_size:]}
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        for i, lang in enumerate(("en", "de")):
            (raw / f"{split}.{lang}").write_text("".join(row[i] + "\n" for row in rows))
    return {split: len(rows) for split, rows in splits.items()}


def make_subwords(work, merges):
    raw, tok, bpe = work / "raw", work / "tok", work / "bpe"
    tok.mkdir(exist_ok=True)
    bpe.mkdir(exist_ok=True)
    for lang in ("en", "de"):
        tokenizer = MosesTokenizer(lang=lang)
        for split in ("train", "valid", "test"):
            lines = (raw / f"{split}.{lang}").read_text().splitlines()
            (tok / f"{split}.{lang}").write_text("".join(
                tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True,
                                   escape=False) + "\n" for line in lines))
    run([BIN / "subword-nmt", "learn-joint-bpe-and-vocab", "--input", tok / "train.en",
         tok / "train.de", "-s", merges, "-o", bpe / "codes", "--write-vocabulary",
         bpe / "vocab.en", bpe / "vocab.de"])
    for lang in ("en", "de"):
        for split in ("train", "valid", "test"):
            run([BIN / "subword-nmt", "apply-bpe", "-c", bpe / "codes", "--vocabulary",
                 bpe / f"vocab.{lang}", "--vocabulary-threshold", "2",
                 "--input", tok / f"{split}.{lang}", "--output", bpe / f"{split}.{lang}"])
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--trainpref", bpe / "train", "--validpref", bpe / "valid", "--testpref", bpe / "test",
         "--destdir", work / "data-bin", "--joined-dictionary", "--workers", "2"],
        log=work / "preprocess.log")


def train(work, name, minutes):
    save = work / "checkpoints" / name
    run([BIN / "fairseq-train", work / "data-bin", "--user-dir", REPO / "fw_fairseq", *ARCH,
         *MODELS[name], *TRAIN, "--save-dir", save, "--stop-time-hours", minutes / 60],
        log=work / f"train.{name}.log")
    log = (work / f"train.{name}.log").read_text()
    updates = re.findall(r"num_updates[ =]+(\d+)", log)
    return save / "checkpoint_last.pt", int(updates[-1]) if updates else 0


def translate(work, name, checkpoint):
    out = work / f"generate.{name}.txt"
    run([BIN / "fairseq-generate", work / "data-bin", "--user-dir", REPO / "fw_fairseq",
         "--path", checkpoint, "--gen-subset", "test", "--beam", "4", "--lenpen", "0.6",
         "--batch-size", "64", "--required-batch-size-multiple", "1", "--remove-bpe",
         # catalog messages are short: stop a rambling hypothesis at 1.2 x source + 10 tokens
         "--max-len-a", "1.2", "--max-len-b", "10"], log=out)
    hyps = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out.read_text(), flags=re.M))
    detok = MosesDetokenizer(lang="de")
    return [detok.detokenize(hyps[str(i)].split()) for i in range(len(hyps))]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=3.0, help="training time per model")
    parser.add_argument("--work-dir", type=Path, default=REPO / "demo_work")
    parser.add_argument("--bpe-merges", type=int, default=2000)
    parser.add_argument("--test-size", type=int, default=500)
    args = parser.parse_args()
    work, start = args.work_dir, time.time()
    work.mkdir(parents=True, exist_ok=True)

    if not (work / "raw/test.de").exists():
        sizes = make_corpus(work, args.test_size)
        say(1, f"corpus: {sizes} sentence pairs from {LOCALE_DIR}")
    else:
        say(1, "corpus: already built")
    if not (work / "data-bin/dict.en.txt").exists():
        make_subwords(work, args.bpe_merges)
    say(2, f"subwords: sacremoses + {args.bpe_merges} joint BPE merges, fairseq-preprocess done")

    references = (work / "raw/test.de").read_text().splitlines()
    sources = (work / "raw/test.en").read_text().splitlines()
    results = {}
    for name in MODELS:
        result_file = work / f"result.{name}.json"
        if result_file.exists():
            results[name] = json.loads(result_file.read_text())
            say(3, f"{name}: already trained and scored")
            continue
        say(3, f"training {name} for {args.minutes:g} min (log: {work / f'train.{name}.log'})")
        checkpoint, updates = train(work, name, args.minutes)
        hypotheses = translate(work, name, checkpoint)
        metric = sacrebleu.BLEU()
        bleu = metric.corpus_score(hypotheses, [references])
        results[name] = {"bleu": round(bleu.score, 2), "updates": updates,
                         "signature": str(metric.get_signature()),
                         "hypotheses": hypotheses}
        result_file.write_text(json.dumps(results[name], ensure_ascii=False, indent=1))
        say(4, f"{name}: {updates} updates, test BLEU {bleu.score:.2f}")

    print(f"\nEnglish -> German, {len(references)} held-out catalog messages, beam 4, sacrebleu")
    print("| model | attention | updates | BLEU |\n|---|---|---:|---:|")
    for name, flags in MODELS.items():
        print(f"| {name} | {' '.join(flags)} | {results[name]['updates']} | "
              f"{results[name]['bleu']:.2f} |")
    print("\nExamples (source / reference / " + " / ".join(MODELS) + "):")
    for i in range(5):
        print(f"  EN  {sources[i]}\n  REF {references[i]}")
        for name in MODELS:
            print(f"  {name:10s} {results[name]['hypotheses'][i]}")
        print()
    print(f"total time {(time.time() - start) / 60:.1f} min; outputs in {work}")


if __name__ == "__main__":
    main()
