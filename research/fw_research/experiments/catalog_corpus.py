"""English -> German parallel text from the machine's German gettext catalogs, made ready for fairseq.

Every Debian machine carries real translations under /usr/share/locale/de/LC_MESSAGES (English msgid ->
German msgstr). Shared by the demo (fw_research.demo.demo) and the attention comparison
(fw_research.demo.compare_attention):

  make_corpus    pairs from the .mo files, deduplicated, shuffled with a fixed seed, split into
                 test / valid / train (raw/{split}.{en,de})
  make_subwords  sacremoses tokenisation that keeps printf / format placeholders whole, joint BPE
                 (subword-nmt), fairseq-preprocess (data-bin/)
  make_long      long messages, held out beside the splits above (raw/{test,valid}_long.{en,de}): catalog
                 messages of 16-40 English words, topped up with messages joined from consecutive entries of one
                 catalog that are in no ordinary split (chosen by long_messages); none is trained on. The ordinary
                 splits keep messages of 2-12 words, so these test how a model trained on short messages translates
                 long ones.
  make_long_subwords  the long split through the ordinary split's tokeniser, BPE codes and dictionary
                 (data-bin/{test,valid}_long.en-de.*): fairseq-generate --gen-subset test_long

Every step writes its outputs last, so a re-run after an interruption redoes only what is missing, and a work
directory built before the long split existed gains it without its corpus, BPE or dictionary being rebuilt.
"""
import gettext
import os
import random
import re
import subprocess
import sys
from pathlib import Path

from sacremoses import MosesTokenizer

from fw_research.experiments.long_messages import JOINED_WORDS, joined_pairs, long_pairs, split_long

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


def catalog_messages(locale_dir):
    """{catalog file name: [(English, German), ...]} of every .mo catalog in the catalog's order, singular one-line
    messages only, cleaned, translated (German differs from English)."""
    catalogs = {}
    for mo in sorted(locale_dir.glob("*.mo")):
        try:
            with open(mo, "rb") as fp:
                catalog = gettext.GNUTranslations(fp)._catalog  # gettext keeps the pairs here
        except (OSError, UnicodeDecodeError):
            continue  # a few old catalogs are in a legacy charset: skip them
        messages = catalogs[mo.name] = []
        for msgid, msgstr in catalog.items():
            if not isinstance(msgid, str) or not msgid or "\n" in msgid.strip():
                continue  # plural forms are keyed by tuples; "" is the header
            msgid = msgid.split("\x04", 1)[-1]  # drop a msgctxt ("context\x04message")
            en, de = clean_message(msgid), clean_message(msgstr)
            if en and de and en != de:
                messages.append((en, de))
    return catalogs


SHORT_WORDS, SHORT_DE_WORDS = (2, 12), 16  # the ordinary splits' messages: English words, German words at most


def is_short(en, de):
    """Whether a pair is of the ordinary splits' lengths."""
    return SHORT_WORDS[0] <= len(en.split()) <= SHORT_WORDS[1] and len(de.split()) <= SHORT_DE_WORDS


def catalog_pairs(locale_dir, catalogs=None):
    """(English, German) message pairs of every .mo catalog of the ordinary splits' lengths, the first German of an
    English message kept, sorted."""
    pairs = {}
    for messages in (catalogs or catalog_messages(locale_dir)).values():
        for en, de in messages:
            if is_short(en, de):
                pairs.setdefault(en, de)
    return sorted(pairs.items())


def _write_split(raw, split, rows):
    for i, lang in enumerate(("en", "de")):
        (raw / f"{split}.{lang}").write_text("".join(row[i] + "\n" for row in rows))


def make_corpus(work, test_size, what="corpus"):
    """raw/{test,valid,train}.{en,de}; returns the number of pairs per split."""
    _need_catalogs(what)
    pairs = catalog_pairs(LOCALE_DIR)
    random.Random(0).shuffle(pairs)
    splits = {"test": pairs[:test_size], "valid": pairs[test_size:2 * test_size],
              "train": pairs[2 * test_size:]}
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        _write_split(raw, split, rows)
    return {split: len(rows) for split, rows in splits.items()}


def _need_catalogs(what):
    if not LOCALE_DIR.is_dir() or not any(LOCALE_DIR.glob("*.mo")):
        sys.exit(f"{what}: no German message catalogs in {LOCALE_DIR}; install some (e.g. "
                 "`apt-get install coreutils` ships de/LC_MESSAGES/coreutils.mo) and re-run")


LONG_SPLITS = ("test_long", "valid_long")


def make_long(work, size, what="corpus"):
    """raw/{test,valid}_long.{en,de} (split_long of long_pairs), none of whose English messages is in raw/'s ordinary
    splits; returns {split: (pairs, joined pairs among them)}."""
    _need_catalogs(what)
    raw = work / "raw"
    ordinary = {line for split in ("train", "valid", "test") for line in (raw / f"{split}.en").read_text().splitlines()}
    natural, joined = long_pairs(catalog_messages(LOCALE_DIR), ordinary)
    splits, joined = split_long(natural, joined, size), set(joined)
    for split in LONG_SPLITS[::-1]:  # test_long last: prepare() takes it as the mark of a finished step
        _write_split(raw, split, splits[split])
    return {split: (len(rows), sum(row in joined for row in rows)) for split, rows in splits.items()}


def tokenize(tokenizer, line):
    """Moses tokens of one line, each format placeholder kept whole."""
    return tokenizer.tokenize(line, aggressive_dash_splits=True, return_str=True, escape=False,
                              protected_patterns=PLACEHOLDERS)


def _tokenize_splits(raw, tok, splits):
    tok.mkdir(exist_ok=True)
    for lang in ("en", "de"):
        tokenizer = MosesTokenizer(lang=lang)
        for split in splits:
            lines = (raw / f"{split}.{lang}").read_text().splitlines()
            (tok / f"{split}.{lang}").write_text("".join(tokenize(tokenizer, line) + "\n" for line in lines))


def _apply_bpe(tok, bpe, splits, what):
    for lang in ("en", "de"):
        for split in splits:
            run([BIN / "subword-nmt", "apply-bpe", "-c", bpe / "codes", "--vocabulary",
                 bpe / f"vocab.{lang}", "--vocabulary-threshold", "2",
                 "--input", tok / f"{split}.{lang}", "--output", bpe / f"{split}.{lang}"], what=what)


def make_subwords(work, merges, what="corpus"):
    """tok/, bpe/ and data-bin/ from raw/."""
    raw, tok, bpe = work / "raw", work / "tok", work / "bpe"
    bpe.mkdir(exist_ok=True)
    _tokenize_splits(raw, tok, ("train", "valid", "test"))
    run([BIN / "subword-nmt", "learn-joint-bpe-and-vocab", "--input", tok / "train.en",
         tok / "train.de", "-s", merges, "-o", bpe / "codes", "--write-vocabulary",
         bpe / "vocab.en", bpe / "vocab.de"], what=what)
    _apply_bpe(tok, bpe, ("train", "valid", "test"), what)
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--trainpref", bpe / "train", "--validpref", bpe / "valid", "--testpref", bpe / "test",
         "--destdir", work / "data-bin", "--joined-dictionary", "--workers", "2"],
        log=work / "preprocess.log", what=what)


def make_long_subwords(work, what="corpus"):
    """data-bin/{test,valid}_long.en-de.* from raw/{test,valid}_long.*, with the ordinary splits' BPE codes and
    dictionary (built by make_subwords; nothing of it is rebuilt)."""
    raw, tok, bpe, data = work / "raw", work / "tok", work / "bpe", work / "data-bin"
    _tokenize_splits(raw, tok, LONG_SPLITS)
    _apply_bpe(tok, bpe, LONG_SPLITS, what)
    scratch = work / "long-bin"  # fairseq-preprocess names test prefixes test, test1: renamed into data-bin
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--testpref", ",".join(str(bpe / split) for split in LONG_SPLITS), "--destdir", scratch,
         "--srcdict", data / "dict.en.txt", "--tgtdict", data / "dict.de.txt", "--workers", "2"],
        log=work / "preprocess_long.log", what=what)
    # valid_long first: data-bin/test_long.en-de.de.idx, written last, marks the step done
    for name, split in sorted(zip(("test", "test1"), LONG_SPLITS), key=lambda pair: pair[1] == "test_long"):
        for lang in ("en", "de"):
            for ext in ("bin", "idx"):
                os.replace(scratch / f"{name}.en-de.{lang}.{ext}", data / f"{split}.en-de.{lang}.{ext}")


def make_joined_train(work, source, what="corpus"):
    """A work directory whose training split is `source`'s plus its training pairs joined (joined_pairs, each pair
    used once more, in a message of JOINED_WORDS English words), everything else `source`'s: the same test, valid
    and long splits, BPE codes and dictionary (the joined pairs are tokenised and cut with those codes, then
    binarised with that dictionary). Only training sentences are joined: no test, valid or long message reaches
    training."""
    raw, tok, bpe, data = (work / d for d in ("raw", "tok", "bpe", "data-bin"))
    for folder in (raw, tok, bpe, data):
        folder.mkdir(parents=True, exist_ok=True)
    train = list(zip(*((source / f"raw/train.{lang}").read_text().splitlines() for lang in ("en", "de"))))
    joined = joined_pairs(train, JOINED_WORDS)
    (raw / "joined.en").write_text("".join(en + "\n" for en, _ in joined))
    (raw / "joined.de").write_text("".join(de + "\n" for _, de in joined))
    _tokenize_splits(raw, tok, ("joined",))
    for name in ("codes", "vocab.en", "vocab.de"):
        (bpe / name).write_bytes((source / "bpe" / name).read_bytes())
    _apply_bpe(tok, bpe, ("joined",), what)
    for lang in ("en", "de"):
        for folder in (bpe, raw):  # the training split, then its joined pairs
            (folder / f"train.{lang}").write_text((source / folder.name / f"train.{lang}").read_text()
                                                  + (folder / f"joined.{lang}").read_text())
        for split in ("valid", "test", *LONG_SPLITS):
            (raw / f"{split}.{lang}").write_bytes((source / f"raw/{split}.{lang}").read_bytes())
    scratch = work / "train-bin"
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", bpe / "train",
         "--destdir", scratch, "--srcdict", source / "data-bin/dict.en.txt",
         "--tgtdict", source / "data-bin/dict.de.txt", "--workers", "2"], log=work / "preprocess_joined.log", what=what)
    for path in sorted((source / "data-bin").iterdir()):
        if not path.name.startswith("train.") and path.name != "preprocess.log":
            (data / path.name).write_bytes(path.read_bytes())
    # the training files last: data-bin/train.en-de.de.idx marks the step done
    for lang in ("en", "de"):
        for ext in ("bin", "idx"):
            os.replace(scratch / f"train.en-de.{lang}.{ext}", data / f"train.en-de.{lang}.{ext}")
    return {"train": len(train) + len(joined), "joined": len(joined)}


def prepare(work, test_size, merges, what="corpus", long_split=True):
    """Corpus and subwords under `work`, with the long split beside them unless `long_split` is False, skipping
    what a previous run finished; returns a status line."""
    work.mkdir(parents=True, exist_ok=True)
    status = "corpus and subwords: already built"
    if not (work / "raw/test.de").exists():
        sizes = make_corpus(work, test_size, what)
        status = f"corpus: {sizes} sentence pairs from {LOCALE_DIR}"
    if not (work / "data-bin/test.en-de.de.idx").exists():  # preprocess writes it last
        make_subwords(work, merges, what)
        status += f"; sacremoses + {merges} joint BPE merges, fairseq-preprocess done"
    if not long_split:
        return status
    if not (work / "raw/test_long.de").exists():
        sizes = make_long(work, test_size, what)
        status += "; long split (pairs, of them joined): " + ", ".join(f"{k} {v}" for k, v in sizes.items())
    if not (work / "data-bin/test_long.en-de.de.idx").exists():
        make_long_subwords(work, what)
        status += "; long split binarised with the ordinary dictionary"
    return status
