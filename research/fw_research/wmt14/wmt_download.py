"""Resumable downloads and checksum bookkeeping for the WMT14 En-De archives.

Digests are strings "ALGO:HEX" (md5 or sha256). Where no digest is published for an
archive we refuse to invent one: the first download is hashed, and once it has been read
as a good archive its sha256 is recorded in a CHECKSUMS file next to it, so later runs (and
copies taken to other machines) are checked against what was actually fetched.
"""
import hashlib
import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

_CHUNK = 1 << 20
_REPORT_EVERY = 256 << 20


def log(msg):
    print(f"[wmt] {msg}", file=sys.stderr, flush=True)


def fetch(url, dest):
    """Download url to dest, resuming from dest.part with an HTTP Range request.

    Servers that ignore Range (and file:// URLs) answer with the whole file, in which case
    the partial file is overwritten rather than appended to.
    """
    dest = Path(dest)
    part = dest.with_name(dest.name + ".part")
    have = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={have}-"} if have else {}
    try:
        resp = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60)
    except urllib.error.HTTPError as err:
        # 416: nothing left past `have`, i.e. the previous run got every byte but was
        # interrupted before the rename; the checksum step judges the result.
        if err.code == 416 and have:
            part.rename(dest)
            return
        raise
    with resp:
        content_range = resp.headers.get("Content-Range", "") if resp.headers else ""
        resumed = have and getattr(resp, "status", None) == 206 and content_range.startswith(f"bytes {have}-")
        if have:
            log(f"{dest.name}: " + (f"resuming at {have} bytes" if resumed else "server sent the whole file, restarting"))
        done = have if resumed else 0
        with open(part, "ab" if resumed else "wb") as out:
            while block := resp.read(_CHUNK):
                out.write(block)
                done += len(block)
                if done % _REPORT_EVERY < len(block):
                    log(f"{dest.name}: {done >> 20} MiB")
    part.rename(dest)


def digest(path, algo):
    h = hashlib.new(algo)
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            h.update(block)
    return f"{algo}:{h.hexdigest()}"


def read_checksums(path):
    """Parse lines "ALGO:HEX  NAME" or plain sha256sum output "HEX  NAME" into {name: [digest]}."""
    table = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        value, name = line.split(maxsplit=1)
        if ":" not in value:
            value = f"sha256:{value}"
        table.setdefault(name.strip().lstrip("*"), []).append(value.lower())
    return table


class ChecksumError(Exception):
    pass


def verify(path, expected):
    """Check path against every expected digest. With none known, return its sha256 for `record`,
    which the caller calls only once the file has been read as a good archive: a digest of a
    broken download, recorded, would refuse the good file later."""
    path = Path(path)
    for want in expected:
        algo = want.split(":", 1)[0]
        if not re.fullmatch(r"(md5|sha1|sha256|sha512):[0-9a-f]+", want):
            raise ChecksumError(f"unreadable checksum {want!r} for {path.name}")
        got = digest(path, algo)
        if got != want:
            raise ChecksumError(
                f"checksum mismatch for {path}: expected {want}, got {got}.\n"
                f"Delete or replace it, then re-run (or pass --no-verify)."
            )
    if expected:
        log(f"{path.name}: checksum ok ({', '.join(e.split(':')[0] for e in expected)})")
        return None
    return digest(path, "sha256")


def record(name, got, record_file):
    """Append digest `got` of the file called `name` to record_file (read_checksums' format)."""
    with open(record_file, "a") as f:
        f.write(f"{got}  {name}\n")
    log(f"{name}: no published checksum known; recorded {got} in {record_file} (later runs verify against it)")
