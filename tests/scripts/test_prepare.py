"""fw_research.wmt14.prepare_wmt14_en_de on the fixture corpus, through the real tools."""
import hashlib
import http.server
import json
import shutil
import subprocess
import sys
import threading

import pytest

from conftest import CORPUS, PREPARE, prepare, run

from fw_research.wmt14 import wmt_download, wmt_text

STEPS = ("extract", "tokenise", "bpe300.learn", "bpe300.apply", "bpe300.clean", "bpe300.preprocess")
NC = "training-parallel-nc-v9.tgz"  # a training archive: no published digest


def test_pipeline_outputs(prepared):
    work, proc = prepared
    dest = work / "data-bin" / "bpe300"
    for split in ("train", "valid", "test"):
        for l in ("en", "de"):
            assert (dest / f"{split}.en-de.{l}.bin").stat().st_size > 0
    assert (dest / "dict.en.txt").read_text() == (dest / "dict.de.txt").read_text()  # joined
    assert json.loads((dest / "wmt_prep.json").read_text())["remove_bpe"] == "subword_nmt"
    # the sacrebleu reference is the untouched text of the sgm file, in file order
    for split, corpus in (("valid", "newstest2013"), ("test", "newstest2014")):
        assert (dest / f"ref.{split}.de").read_text() == (CORPUS / f"{corpus}.de").read_text()
    tok_test = (dest / "tok.test.de").read_text().splitlines()
    assert len(tok_test) == 53 and "„ Katastrophe “ ." in tok_test[-3]
    # unknown digests are recorded, the given ones verified
    recorded = (work / "orig" / "CHECKSUMS").read_text()
    assert recorded.count("sha256:") == 3 and "test.tgz" not in recorded
    assert "test.tgz: checksum ok" in proc.stderr


def test_text_steps(prepared):
    work, _ = prepared
    train_en = (work / "tok" / "train.en").read_text().splitlines()
    assert len(train_en) == 203 + 124 + 115  # Europarl, CommonCrawl, NC v9; decoy pair ignored
    assert "The hotel is close to the centre and the beach ." in train_en  # \p{C} -> space
    assert "It &apos;s a long @-@ term investment in the region &apos;s future ." in train_en
    bpe = (work / "bpe300" / "sub.train.en").read_text()
    assert "@@ " in bpe
    clean_en = (work / "bpe300" / "train.en").read_text().splitlines()
    clean_de = (work / "bpe300" / "train.de").read_text().splitlines()
    # the empty pair and the 2:30 ratio pair go (plus a few short ones whose BPE ratio > 1.5)
    assert len(clean_en) == len(clean_de) < len(train_en) - 1
    assert "" not in clean_en and not any(line.startswith("C@@ li@@") for line in clean_en)
    assert all(wmt_text.clean_pair(e, d, 1.5, 1, 250) == [e, d] for e, d in zip(clean_en, clean_de))


def test_rerun_skips_every_step(prepared, archives, checksums):
    work, _ = prepared
    before = (work / "data-bin" / "bpe300" / "train.en-de.en.bin").stat().st_mtime_ns
    proc = prepare(work, archives, "--checksums", checksums)
    for step in STEPS:
        assert f"{step}: done already, skipping" in proc.stderr
    assert "running" not in proc.stderr and "downloading" not in proc.stderr
    assert (work / "data-bin" / "bpe300" / "train.en-de.en.bin").stat().st_mtime_ns == before


def test_sentencepiece_variant(prepared_spm):
    work, proc = prepared_spm
    assert "tokenise: done already, skipping" in proc.stderr  # shared with the BPE run
    dest = work / "data-bin" / "spm400"
    assert json.loads((dest / "wmt_prep.json").read_text())["remove_bpe"] == "sentencepiece"
    assert (work / "spm400" / "spm.model").exists()
    assert "\u2581" in (work / "spm400" / "sub.test.de").read_text()
    assert (dest / "test.en-de.de.bin").stat().st_size > 0


def _fail(*cmd):
    proc = subprocess.run([*PREPARE, *map(str, cmd)],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    return proc.stderr


def test_missing_raw_archives_say_what_to_download(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "test.tgz").write_bytes(b"")
    err = _fail("--work-dir", tmp_path / "work", "--raw-dir", tmp_path / "raw")
    assert "missing input archives" in err
    assert f"{tmp_path / 'raw' / 'training-parallel-nc-v9.tgz'}  (download https://statmt.org/wmt14/training-parallel-nc-v9.tgz)" in err
    assert "test.tgz " not in err  # present, so not listed
    assert f"Download them into {tmp_path / 'raw'} and re-run" in err


def test_failed_download_says_where_to_put_the_file(tmp_path):
    err = _fail("--work-dir", tmp_path / "work", "--mirror", (tmp_path / "nowhere").as_uri())
    assert "could not download file://" in err
    assert f"Download it yourself to {tmp_path / 'work' / 'orig' / 'training-parallel-europarl-v7.tgz'}" in err


def _sha256_line(path):
    return f"sha256:{hashlib.sha256(path.read_bytes()).hexdigest()}  {path.name}\n"


def _last_line_names(err, path):
    """The run failed with one line naming path, and no traceback."""
    assert "Traceback" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("prepare_wmt14_en_de: ") and str(path) in last, err


@pytest.mark.parametrize("damage", ["html", "truncated"])
def test_unreadable_archive_is_not_recorded_and_checksums_win(tmp_path, archives, checksums, damage):
    raw, work = tmp_path / "raw", tmp_path / "work"
    shutil.copytree(archives, raw)
    good = (raw / NC).read_bytes()
    (raw / NC).write_bytes(b"<html>404 Not Found</html>\n" if damage == "html" else good[: len(good) // 2])
    err = _fail("--work-dir", work, "--raw-dir", raw, "--checksums", checksums)
    _last_line_names(err, raw / NC)
    record = work / "orig" / "CHECKSUMS"
    assert NC not in (record.read_text() if record.exists() else "")  # nothing recorded before a good read
    # the good archive passes, even against a digest of the bad one recorded by an earlier version,
    # when --checksums names it; its digest, and the others', are recorded once they have been read
    record.write_text(_sha256_line(raw / NC))
    (raw / NC).write_bytes(good)
    sums = tmp_path / "sums"
    sums.write_text(checksums.read_text() + _sha256_line(raw / NC))
    proc = run([*PREPARE, "--work-dir", work, "--raw-dir", raw,
                "--checksums", sums, "--bpe-merges", "300", "--workers", "2"])
    assert f"{NC}: checksum ok" in proc.stderr
    assert (work / "data-bin" / "bpe300" / "train.en-de.en.bin").stat().st_size > 0
    assert record.read_text().count("sha256:") == 3  # the stale line, europarl's and commoncrawl's


@pytest.mark.parametrize("damage", ["html", "truncated"])
def test_no_verify_unreadable_archive_is_one_line_naming_it(tmp_path, archives, damage):
    raw = tmp_path / "raw"
    shutil.copytree(archives, raw)
    bad = raw / "test-full.tgz"
    bad.write_bytes(b"" if damage == "html" else bad.read_bytes()[:-200])
    _last_line_names(_fail("--work-dir", tmp_path / "work", "--raw-dir", raw, "--no-verify"), bad)


def test_checksum_mismatch_stops(tmp_path, archives, checksums):
    raw = tmp_path / "raw"
    shutil.copytree(archives, raw)
    sums = tmp_path / "sums"
    good = [line for line in checksums.read_text().splitlines() if line.endswith(" test.tgz")]
    sums.write_text(good[0] + "\nmd5:00000000000000000000000000000000  test-full.tgz\n")
    err = _fail("--work-dir", tmp_path / "work", "--raw-dir", raw, "--checksums", sums)
    assert f"checksum mismatch for {raw / 'test-full.tgz'}" in err


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """Serves one payload, honouring "Range: bytes=N-" (the stdlib handler ignores Range)."""
    payload = b""
    ranges = []

    def do_GET(self):
        start = int(self.headers.get("Range", "bytes=0-")[6:].rstrip("-"))
        self.ranges.append(start)
        body = self.payload[start:]
        self.send_response(206 if start else 200)
        if start:
            self.send_header("Content-Range", f"bytes {start}-{len(self.payload) - 1}/{len(self.payload)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_fetch_resumes_a_partial_download(tmp_path):
    payload = bytes(range(256)) * 4096
    _RangeHandler.payload = payload
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RangeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        dest = tmp_path / "a.tgz"
        (tmp_path / "a.tgz.part").write_bytes(payload[:300_000])
        wmt_download.fetch(f"http://127.0.0.1:{server.server_port}/a.tgz", dest)
    finally:
        server.shutdown()
    assert _RangeHandler.ranges == [300_000]
    assert dest.read_bytes() == payload and not (tmp_path / "a.tgz.part").exists()


def test_fetch_restarts_when_the_server_ignores_range(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"0123456789" * 1000)
    (tmp_path / "b.bin.part").write_bytes(b"garbage")
    wmt_download.fetch(src.as_uri(), tmp_path / "b.bin")  # file:// ignores Range
    assert (tmp_path / "b.bin").read_bytes() == src.read_bytes()


def test_verify_records_then_checks(tmp_path):
    f, record = tmp_path / "x.tgz", tmp_path / "CHECKSUMS"
    f.write_bytes(b"data")
    digest = f"sha256:{hashlib.sha256(b'data').hexdigest()}"
    assert wmt_download.verify(f, []) == digest and not record.exists()  # the caller records it, later
    wmt_download.record(f.name, digest, record)
    assert wmt_download.read_checksums(record) == {"x.tgz": [digest]}
    assert wmt_download.verify(f, [digest, f"md5:{hashlib.md5(b'data').hexdigest()}"]) is None
    with pytest.raises(wmt_download.ChecksumError, match="checksum mismatch"):
        wmt_download.verify(f, ["sha256:" + "0" * 64])


def test_clean_pair_matches_clean_corpus_n():
    assert wmt_text.clean_pair(" a  b ", "c d", 1.5, 1, 250) == ["a b", "c d"]
    assert wmt_text.clean_pair("", "x", 1.5, 1, 250) is None
    assert wmt_text.clean_pair("a b c d", "x y", 1.5, 1, 250) is None  # ratio 2 > 1.5
    assert wmt_text.clean_pair("a b c", "x y", 1.5, 1, 250) == ["a b c", "x y"]  # ratio 1.5 kept
    assert wmt_text.clean_pair("a " * 251, "b " * 251, 1.5, 1, 250) is None
    assert wmt_text.clean_pair("a | b", "x y", 1.5, 1, 250) == ["a b", "x y"]


def test_sgm_segments_keep_file_order():
    sgm = ['<doc docid="1">', '<seg id="2"> second  one </seg>', '<seg id="1">first</seg>', "</doc>"]
    assert wmt_text.sgm_to_lines(sgm) == ["second one", "first"]


def test_tokenise_train_and_test_like_the_fairseq_script():
    line = "It\u2019s \u201cstate-of-the-art\u201d\u200b & cheap."
    train, test = (wmt_text.tokenise_lines([line], "en", t)[0] for t in (True, False))
    assert train == "It &apos;s &quot; state @-@ of @-@ the @-@ art &quot; &amp; cheap ."
    assert test.startswith("It &apos;s “ state @-@ of @-@ the @-@ art ”")  # test: only ’ -> '
