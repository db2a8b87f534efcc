"""English -> German parallel text from the machine's German gettext catalogs, made ready for fairseq.

Every Debian machine carries real translations under /usr/share/locale/de/LC_MESSAGES (English msgid ->
German msgstr). Shared by the demo (scripts/demo.py) and the attention comparison
(scripts/compare_attention.py):

  make_corpus    pairs from the .mo files, deduplicated, shuffled with a fixed seed, split into
                 test / valid / train (raw/{split}.{en,de})
  make_subwords  sacremoses tokenisation that keeps printf / format placeholders whole, joint BPE
                 (subword-nmt), fairseq-preprocess (data-bin/)

Both steps write their outputs last, so a re-run after an interruption redoes only what is missing.
"""
import gettext
import random
import re
import subprocess
import sys
from pathlib import Path

from sacremoses import MosesTokenizer

BIN = Path(sys.executable).parent
LOCALE_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
# Format placeholders are code, not words: Moses would split `%s` into `% s` and `{0}` into `{ 0 }`,
# and the detokenised translation would keep the space (`% s kann nicht ...`). Kept as one token,
# BPE may still cut it into subwords, which --remove-bpe joins again.
PLACEHOLDERS = [
    r"%(?:\d+\$)?[-+#0]*\d*(?:\.\d+)?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn]",  # %s %d %1$s %-10lu
    r"%\(\w+\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]",  # Python's %(name)s
    r"\{\w*(?:![rsa])?(?::[^{}\s]*)?\}",  # {0} {} {name} {0:>8}
    r"%%",  # a literal percent sign in a format string
]


def run(args, log=None, what="corpus"):
    """Run a CLI; keep its output in `log` and stop with the log's tail if it fails."""
    with open(log or "/dev/null", "w") as sink:
        proc = subprocess.run([str(a) for a in args], stdout=sink, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = Path(log).read_text()[-3000:] if log else ""
        sys.exit(f"{what}: {Path(str(args[0])).name} failed (exit {proc.returncode})\n{tail}")


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


def make_corpus(work, test_size, what="corpus"):
    """raw/{test,valid,train}.{en,de}; returns the number of pairs per split."""
    if not LOCALE_DIR.is_dir() or not any(LOCALE_DIR.glob("*.mo")):
        sys.exit(f"{what}: no German message catalogs in {LOCALE_DIR}; install some (e.g. "
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


def tokenize(tokenizer, line):
    """Moses tokens of one line, each format placeholder kept whole."""
    return tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=False,
                              protected_patterns=PLACEHOLDERS)


def make_subwords(work, merges, what="corpus"):
    """tok/, bpe/ and data-bin/ from raw/."""
    raw, tok, bpe = work / "raw", work / "tok", work / "bpe"
    tok.mkdir(exist_ok=True)
    bpe.mkdir(exist_ok=True)
    for lang in ("en", "de"):
        tokenizer = MosesTokenizer(lang=lang)
        for split in ("train", "valid", "test"):
            lines = (raw / f"{split}.{lang}").read_text().splitlines()
            (tok / f"{split}.{lang}").write_text("".join(tokenize(tokenizer, line) + "\n" for line in lines))
    run([BIN / "subword-nmt", "learn-joint-bpe-and-vocab", "--input", tok / "train.en",
         tok / "train.de", "-s", merges, "-o", bpe / "codes", "--write-vocabulary",
         bpe / "vocab.en", bpe / "vocab.de"], what=what)
    for lang in ("en", "de"):
        for split in ("train", "valid", "test"):
            run([BIN / "subword-nmt", "apply-bpe", "-c", bpe / "codes", "--vocabulary",
                 bpe / f"vocab.{lang}", "--vocabulary-threshold", "2",
                 "--input", tok / f"{split}.{lang}", "--output", bpe / f"{split}.{lang}"], what=what)
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--trainpref", bpe / "train", "--validpref", bpe / "valid", "--testpref", bpe / "test",
         "--destdir", work / "data-bin", "--joined-dictionary", "--workers", "2"],
        log=work / "preprocess.log", what=what)


def prepare(work, test_size, merges, what="corpus"):
    """Corpus and subwords under `work`, skipping what a previous run finished; returns a status line."""
    work.mkdir(parents=True, exist_ok=True)
    status = "corpus and subwords: already built"
    if not (work / "raw/test.de").exists():
        sizes = make_corpus(work, test_size, what)
        status = f"corpus: {sizes} sentence pairs from {LOCALE_DIR}"
    if not (work / "data-bin/test.en-de.de.idx").exists():  # preprocess writes it last
        make_subwords(work, merges, what)
        status += f"; sacremoses + {merges} joint BPE merges, fairseq-preprocess done"
    return status
