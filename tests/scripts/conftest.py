"""Shared fixtures: WMT-shaped archives built from the small committed corpus.

The corpus (tests/scripts/fixtures/corpus) is synthetic En/De news and parliament prose
plus a few hand-written lines with quotes, apostrophes, hyphenated compounds and noise
(an empty pair, a bad length ratio, control characters, "|") so that every text step has
something to do.
"""
import hashlib
import io
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WMT14 = REPO / "scripts" / "wmt14"  # train.sh, evaluate.sh and table1.sh, which these tests run
PREPARE = [sys.executable, "-m", "fw_research.wmt14.prepare_wmt14_en_de"]
CORPUS = Path(__file__).parent / "fixtures" / "corpus"
BIN = Path(sys.executable).parent

ARCHIVES = {
    "training-parallel-europarl-v7.tgz": {
        "training/europarl-v7.de-en.{l}": "europarl-v7.{l}",
        # a decoy: the real archive holds every language pair
        "training/europarl-v7.fr-en.{l}": "europarl-v7.{l}",
    },
    "training-parallel-commoncrawl.tgz": {"commoncrawl.de-en.{l}": "commoncrawl.{l}"},
    "training-parallel-nc-v9.tgz": {"training/news-commentary-v9.de-en.{l}": "news-commentary-v9.{l}"},
}


def to_sgm(lines, lang, kind, setid, docsize=10):
    """WMT "fake SGML": segment ids restart in every document, as in the real files."""
    tag = "refset" if kind == "ref" else "srcset"
    out = [f'<{tag} setid="{setid}" srclang="any" trglang="{lang}">']
    for d in range(0, len(lines), docsize):
        out.append(f'<doc sysid="{kind}" docid="doc{d // docsize}" genre="news" origlang="en">')
        out += [f'<seg id="{i + 1}">  {line} </seg>' for i, line in enumerate(lines[d:d + docsize])]
        out.append("</doc>")
    out.append(f"</{tag}>")
    return "\n".join(out) + "\n"


def add_member(tar, name, data):
    """A file `name` holding the bytes `data` in an open tar archive."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def build_archives(dest):
    dest.mkdir(parents=True, exist_ok=True)
    for archive, members in ARCHIVES.items():
        with tarfile.open(dest / archive, "w:gz") as tar:
            for inner, corpus in members.items():
                for l in ("en", "de"):
                    add_member(tar, inner.format(l=l), (CORPUS / corpus.format(l=l)).read_bytes())
    lines = {(c, l): (CORPUS / f"{c}.{l}").read_text("utf-8").splitlines()
             for c in ("newstest2013", "newstest2014") for l in ("en", "de")}
    with tarfile.open(dest / "test.tgz", "w:gz") as tar:
        for l in ("en", "de"):
            sgm = to_sgm(lines["newstest2013", l], l, "src", "newstest2013")
            add_member(tar, f"test/newstest2013-src.{l}.sgm", sgm.encode())
    with tarfile.open(dest / "test-full.tgz", "w:gz") as tar:
        add_member(tar, "test-full/newstest2014-deen-src.en.sgm",
             to_sgm(lines["newstest2014", "en"], "en", "src", "newstest2014").encode())
        add_member(tar, "test-full/newstest2014-deen-ref.de.sgm",
             to_sgm(lines["newstest2014", "de"], "de", "ref", "newstest2014").encode())
    return dest


@pytest.fixture(scope="session")
def archives(tmp_path_factory):
    return build_archives(tmp_path_factory.mktemp("archives"))


def run(cmd, **kw):
    """Run a command with the test interpreter's environment first on PATH; fail loudly."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", **kw.pop("env", {}))
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, cwd=REPO, **kw)
    if proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def prepare(work, archives, *extra, **kw):
    """Run the preparation fetching from a file:// mirror of `archives`."""
    return run([*PREPARE, "--work-dir", work,
                "--mirror", archives.as_uri(), "--bpe-merges", "300", "--workers", "2", *extra], **kw)


@pytest.fixture(scope="session")
def checksums(archives, tmp_path_factory):
    """sha256 of the fixture test archives, replacing sacrebleu's md5 of the real ones."""
    path = tmp_path_factory.mktemp("sums") / "SHA256SUMS"
    path.write_text("".join(f"{hashlib.sha256((archives / n).read_bytes()).hexdigest()}  {n}\n"
                            for n in ("test.tgz", "test-full.tgz")))
    return path


@pytest.fixture(scope="session")
def prepared(archives, checksums, tmp_path_factory):
    """(work dir, completed process) of a BPE (300 merges) preparation."""
    work = tmp_path_factory.mktemp("work")
    return work, prepare(work, archives, "--checksums", checksums)


@pytest.fixture(scope="session")
def prepared_spm(prepared, archives, checksums):
    """The sentencepiece variant, in the same work dir (so it reuses the shared steps)."""
    work, _ = prepared
    return work, prepare(work, archives, "--checksums", checksums, "--spm", "--spm-vocab-size", "400")


# The softmax teacher of the conversion tests (test_convert_softmax.py, test_convert_recipe.py): a
# transformer_vaswani_wmt_en_de_big shrunk to these dims, trained 2 updates by fairseq-train, once per run
SHRUNK = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "48",
          "--decoder-ffn-embed-dim", "48", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
          "--encoder-layers", "2", "--decoder-layers", "2", "--share-all-embeddings"]
TRAIN = ["--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--no-epoch-checkpoints", "--cpu",
         "--seed", "1", "--log-format", "none", "--num-workers", "0"]


def reversed_copy_corpus(work):
    """A copy task in reverse over 30 words, binarised with a joined dictionary."""
    r = random.Random(0)
    for split, n in (("train", 48), ("valid", 8), ("test", 8)):
        src = [" ".join(f"w{r.randrange(30)}" for _ in range(r.randint(3, 7))) for _ in range(n)]
        (work / f"{split}.en").write_text("\n".join(src) + "\n")
        (work / f"{split}.de").write_text("\n".join(" ".join(s.split()[::-1]) for s in src) + "\n")
    run([str(BIN / "fairseq-preprocess"), "--source-lang", "en", "--target-lang", "de", "--joined-dictionary",
         "--workers", "1", "--destdir", str(work / "bin"),
         *(arg for split in ("train", "valid", "test") for arg in (f"--{split}pref", str(work / split)))])
    return work / "bin"


@pytest.fixture(scope="session")
def teacher(tmp_path_factory):
    """(work dir, data-bin, the teacher's checkpoint_last.pt)."""
    work = tmp_path_factory.mktemp("convert")
    data = reversed_copy_corpus(work)
    run([str(BIN / "fairseq-train"), str(data), "--arch", "transformer_vaswani_wmt_en_de_big", *SHRUNK, *TRAIN,
         "--max-update", "2", "--save-dir", str(work / "teacher")])
    return work, data, work / "teacher" / "checkpoint_last.pt"
