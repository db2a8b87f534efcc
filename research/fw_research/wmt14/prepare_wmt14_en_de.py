#!/usr/bin/env python3
"""Prepare WMT14 English-German as in fairseq's `prepare-wmt14en2de.sh --icml17`.

Training data: Europarl v7 + CommonCrawl + News Commentary v9 (4.5M pairs). Unlike that
script, which holds out every 100th training pair as its validation set, validation is
newstest2013: the paper does not name its validation set, but the "standard setup" it cites
(Vaswani et al. 2017, Ott et al. 2018) uses newstest2013, and its valid scores, about 1 BLEU
below test, fit it. Test is newstest2014 (full).

Steps, each leaving a marker under WORK/.done so that a re-run skips it (once a step has
to run, every later one runs too): fetch archives -> extract -> Moses-normalise/tokenise
-> learn + apply joint BPE (subword-nmt, or --spm for sentencepiece on the tokenised
text) -> clean training pairs (ratio 1.5, 1-250 tokens) -> fairseq-preprocess
--joined-dictionary. The destination also gets the references for scoring: ref.{valid,test}.de
(detokenised, for sacrebleu) and tok.{valid,test}.de (Moses-tokenised, for tokenised BLEU).
"""
import argparse
import gzip
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zlib
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

from fw_research.wmt14 import wmt_download as dl
from fw_research.wmt14 import wmt_text as text

REPO = Path(__file__).resolve().parents[3]
LANGS = ("en", "de")
TRAIN_CORPORA = ("europarl-v7", "commoncrawl", "news-commentary-v9")


@dataclass(frozen=True)
class Source:
    name: str  # file name of the archive, as the URL serves it
    url: str
    digests: tuple  # published digests; () where none is known (see wmt_download)
    members: tuple  # (output name under WORK/raw, path inside the archive)


# md5s of the two test archives are the ones sacrebleu 2.6 ships for wmt13 and wmt14/full.
SOURCES = (
    Source("training-parallel-europarl-v7.tgz", "https://statmt.org/wmt13/training-parallel-europarl-v7.tgz", (),
           tuple((f"europarl-v7.{l}", f"training/europarl-v7.de-en.{l}") for l in LANGS)),
    Source("training-parallel-commoncrawl.tgz", "https://statmt.org/wmt13/training-parallel-commoncrawl.tgz", (),
           tuple((f"commoncrawl.{l}", f"commoncrawl.de-en.{l}") for l in LANGS)),
    Source("training-parallel-nc-v9.tgz", "https://statmt.org/wmt14/training-parallel-nc-v9.tgz", (),
           tuple((f"news-commentary-v9.{l}", f"training/news-commentary-v9.de-en.{l}") for l in LANGS)),
    Source("test.tgz", "https://statmt.org/wmt13/test.tgz", ("md5:48eca5d02f637af44e85186847141f67",),
           tuple((f"newstest2013.{l}", f"test/newstest2013-src.{l}.sgm") for l in LANGS)),
    Source("test-full.tgz", "https://statmt.org/wmt14/test-full.tgz", ("md5:a8cd784e006feb32ac6f3d9ec7eb389a",),
           (("newstest2014.en", "test-full/newstest2014-deen-src.en.sgm"),
            ("newstest2014.de", "test-full/newstest2014-deen-ref.de.sgm"))),
)


class PrepError(Exception):
    pass


class Steps:
    """Runs named steps in order, skipping those whose marker exists until one must run."""

    def __init__(self, marker_dir):
        self.marker_dir = Path(marker_dir)
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        self.forced = False

    def run(self, name, fn, *args):
        marker = self.marker_dir / name
        if marker.exists() and not self.forced:
            dl.log(f"{name}: done already, skipping")
            return
        dl.log(f"{name}: running")
        marker.unlink(missing_ok=True)
        fn(*args)
        marker.touch()
        self.forced = True


def tool(name):
    """A console script from the running interpreter's environment, else from PATH."""
    local = Path(sys.executable).parent / name
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        raise PrepError(f"{name} not found: install the project's environment (make setup)")
    return found


def locate_archives(args, orig):
    """Path of every archive, downloading what is missing unless --raw-dir says we're offline."""
    urls = {s.name: s.url for s in SOURCES}
    if args.mirror:
        urls = {name: f"{args.mirror.rstrip('/')}/{name}" for name in urls}
    for override in args.url:
        name, _, url = override.partition("=")
        if name not in urls or not url:
            raise PrepError(f"--url {override!r}: expected NAME=URL with NAME one of {', '.join(urls)}")
        urls[name] = url
    where = Path(args.raw_dir) if args.raw_dir else orig
    missing = [s.name for s in SOURCES if not (where / s.name).exists()]
    if args.raw_dir and missing:
        raise PrepError("missing input archives:\n" + "\n".join(
            f"  {where / n}  (download {urls[n]})" for n in missing) +
            f"\nDownload them into {where} and re-run.")
    for name in missing:
        try:
            dl.log(f"downloading {urls[name]}")
            dl.fetch(urls[name], where / name)
        except (OSError, ValueError) as err:
            raise PrepError(f"could not download {urls[name]}: {err}\n"
                            f"Download it yourself to {where / name} (or put all archives in a "
                            f"directory and pass --raw-dir DIR), then re-run.") from err
    return {s.name: where / s.name for s in SOURCES}


def verify_archives(args, archives, orig):
    """Digests: --checksums' where it names the archive (a re-packed mirror, or a stale CHECKSUMS
    line), else those recorded by earlier runs plus the published ones. Returns {name: sha256} of
    the archives with none known, for extract to record once it has read them."""
    record = orig / "CHECKSUMS"
    recorded = dl.read_checksums(record) if record.exists() else {}
    given = dl.read_checksums(args.checksums) if args.checksums else {}
    unrecorded = {}
    for s in SOURCES:
        expected = given.get(s.name) or sorted(set(recorded.get(s.name, [])) | set(s.digests))
        got = dl.verify(archives[s.name], expected)
        if got:
            unrecorded[s.name] = got
    return unrecorded


def extract_one(job):
    archive, members, raw = job
    wanted = {inner: out for out, inner in members}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                out = wanted.pop(member.name.removeprefix("./"), None)
                if out is None:
                    continue
                # Streamed: the training members are hundreds of MB each.
                stream = io.TextIOWrapper(tar.extractfile(member), encoding="utf-8", errors="replace", newline="\n")
                lines = (line.rstrip("\n") for line in stream)
                if member.name.endswith(".sgm"):
                    lines = text.sgm_to_lines(lines)
                with text.open_text(raw / out, "w") as f:
                    f.writelines(line + "\n" for line in lines)
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as err:
        # a PrepError, which main reports in one line (tarfile's messages span several lines)
        raise PrepError(f"cannot read {archive} ({' '.join(str(err).split())}): replace it with a good "
                        f"copy (or delete it to download it again) and re-run") from None
    if wanted:
        raise PrepError(f"{archive} lacks {', '.join(wanted)}: is it the right archive?")


def extract(archives, raw, workers, unrecorded, record_file):
    """Extracts every archive; records `unrecorded` digests only then, once the files proved good."""
    raw.mkdir(parents=True, exist_ok=True)
    jobs = [(archives[s.name], s.members, raw) for s in SOURCES]
    with Pool(min(workers, len(jobs))) as pool:
        pool.map(extract_one, jobs)
    for corpus in TRAIN_CORPORA + ("newstest2013", "newstest2014"):
        counts = [text.count_lines(raw / f"{corpus}.{l}") for l in LANGS]
        if counts[0] != counts[1]:
            raise PrepError(f"{corpus}: {counts[0]} English vs {counts[1]} German lines")
    for name, got in unrecorded.items():
        dl.record(name, got, record_file)


def tokenise(raw, tok, workers):
    tok.mkdir(parents=True, exist_ok=True)
    for l in LANGS:
        text.tokenise_files([raw / f"{c}.{l}" for c in TRAIN_CORPORA], tok / f"train.{l}", l, True, workers)
        text.tokenise_files([raw / f"newstest2013.{l}"], tok / f"valid.{l}", l, False, workers)
        text.tokenise_files([raw / f"newstest2014.{l}"], tok / f"test.{l}", l, False, workers)


def joint_train_text(tok, sub):
    joint = sub / "train.joint"
    with open(joint, "wb") as out:
        for l in LANGS:
            with open(tok / f"train.{l}", "rb") as f:
                shutil.copyfileobj(f, out)
    return joint


def learn_bpe(tok, sub, merges, workers):
    sub.mkdir(parents=True, exist_ok=True)
    joint = joint_train_text(tok, sub)
    subprocess.run([tool("subword-nmt"), "learn-bpe", "-s", str(merges), "--num-workers", str(workers),
                    "-i", str(joint), "-o", str(sub / "code")], check=True)
    joint.unlink()


def apply_bpe(tok, sub, workers):
    for split in ("train", "valid", "test"):
        for l in LANGS:
            subprocess.run([tool("subword-nmt"), "apply-bpe", "-c", str(sub / "code"), "--num-workers",
                            str(workers), "-i", str(tok / f"{split}.{l}"), "-o", str(sub / f"sub.{split}.{l}")],
                           check=True)


def learn_spm(tok, sub, vocab_size, workers):
    import sentencepiece as spm

    sub.mkdir(parents=True, exist_ok=True)
    joint = joint_train_text(tok, sub)
    spm.SentencePieceTrainer.train(
        input=str(joint), model_prefix=str(sub / "spm"), vocab_size=vocab_size, model_type="bpe",
        character_coverage=1.0, input_sentence_size=10_000_000, shuffle_input_sentence=True,
        num_threads=workers, minloglevel=1)
    joint.unlink()


def apply_spm(tok, sub, workers):
    import sentencepiece as spm

    model = spm.SentencePieceProcessor(model_file=str(sub / "spm.model"))
    for split in ("train", "valid", "test"):
        for l in LANGS:
            lines = text.read_lines(tok / f"{split}.{l}")
            with text.open_text(sub / f"sub.{split}.{l}", "w") as f:
                while chunk := list(itertools.islice(lines, 100_000)):
                    pieces = model.encode(chunk, out_type=str, num_threads=workers)
                    f.writelines(" ".join(p) + "\n" for p in pieces)


def clean(sub):
    # Only the training pairs are filtered: valid/test must keep every line to stay aligned
    # with their references.
    kept, total = text.clean_corpus(*(sub / f"sub.train.{l}" for l in LANGS), *(sub / f"train.{l}" for l in LANGS))
    dl.log(f"clean: kept {kept} of {total} training pairs")


def preprocess(raw, tok, sub, dest, remove_bpe, workers):
    if dest.exists():
        shutil.rmtree(dest)
    subprocess.run([tool("fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de",
                    "--trainpref", str(sub / "train"), "--validpref", str(sub / "sub.valid"),
                    "--testpref", str(sub / "sub.test"), "--destdir", str(dest),
                    "--joined-dictionary", "--workers", str(workers)], check=True)
    for split, corpus in (("valid", "newstest2013"), ("test", "newstest2014")):
        shutil.copyfile(raw / f"{corpus}.de", dest / f"ref.{split}.de")
        shutil.copyfile(tok / f"{split}.de", dest / f"tok.{split}.de")
    info = {"remove_bpe": remove_bpe, "source_lang": "en", "target_lang": "de",
            "valid": "newstest2013", "test": "newstest2014 (full)"}
    (dest / "wmt_prep.json").write_text(json.dumps(info, indent=1) + "\n")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work-dir", default=str(REPO / "work" / "wmt14_en_de"), help="downloads and intermediate files")
    p.add_argument("--dest-dir", help="fairseq data-bin output (default: WORK/data-bin/bpe<N> or spm<V>)")
    p.add_argument("--raw-dir", help="directory already holding the five archives; nothing is downloaded")
    p.add_argument("--mirror", help="base URL to fetch every archive from (BASE/<archive name>)")
    p.add_argument("--url", action="append", default=[], metavar="NAME=URL", help="override one archive's URL")
    p.add_argument("--checksums", help="file of 'ALGO:HEX  NAME' (or sha256sum) lines; replaces the published "
                   "and recorded (WORK/orig/CHECKSUMS) digests of the archives it names")
    p.add_argument("--no-verify", action="store_true", help="skip checksum verification")
    p.add_argument("--bpe-merges", type=int, default=32000, help="subword-nmt merge operations (paper: 32K)")
    p.add_argument("--spm", action="store_true",
                   help="joint sentencepiece (BPE) model instead of subword-nmt, trained and applied on the "
                        "Moses-tokenised text so that evaluation is the same for both")
    p.add_argument("--spm-vocab-size", type=int, default=32000)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    work = Path(args.work_dir).resolve()
    orig, raw, tok = work / "orig", work / "raw", work / "tok"
    tag = f"spm{args.spm_vocab_size}" if args.spm else f"bpe{args.bpe_merges}"
    sub = work / tag
    dest = Path(args.dest_dir).resolve() if args.dest_dir else work / "data-bin" / tag
    orig.mkdir(parents=True, exist_ok=True)
    steps = Steps(work / ".done")
    try:
        archives = {s.name: Path(args.raw_dir or orig) / s.name for s in SOURCES}
        unrecorded = {}
        if not (steps.marker_dir / "extract").exists():
            archives = locate_archives(args, orig)
            if not args.no_verify:
                unrecorded = verify_archives(args, archives, orig)
        steps.run("extract", extract, archives, raw, args.workers, unrecorded, orig / "CHECKSUMS")
        steps.run("tokenise", tokenise, raw, tok, args.workers)
        if args.spm:
            steps.run(f"{tag}.learn", learn_spm, tok, sub, args.spm_vocab_size, args.workers)
            steps.run(f"{tag}.apply", apply_spm, tok, sub, args.workers)
        else:
            steps.run(f"{tag}.learn", learn_bpe, tok, sub, args.bpe_merges, args.workers)
            steps.run(f"{tag}.apply", apply_bpe, tok, sub, args.workers)
        steps.run(f"{tag}.clean", clean, sub)
        steps.forced |= not (dest / "wmt_prep.json").exists()
        steps.run(f"{tag}.preprocess", preprocess, raw, tok, sub, dest,
                  "sentencepiece" if args.spm else "subword_nmt", args.workers)
    except (PrepError, dl.ChecksumError, subprocess.CalledProcessError) as err:
        sys.exit(f"prepare_wmt14_en_de: {err}")
    dl.log(f"ready: {dest}")


if __name__ == "__main__":
    main()
