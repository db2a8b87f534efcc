"""Shared fixtures: WMT-shaped archives built from the small committed corpus.

The corpus (tests/scripts/fixtures/corpus) is synthetic En/De news and parliament prose
plus a few hand-written lines with quotes, apostrophes, hyphenated compounds and noise
(an empty pair, a bad length ratio, control characters, "|") so that every text step has
something to do.
"""
import hashlib
import io
import os
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
