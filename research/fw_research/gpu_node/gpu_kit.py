"""Build (or check) the offline GPU node's install kit: `make gpu-kit` runs this on a machine with network.

    python -m fw_research.gpu_node.gpu_kit [--out gpu_kit]   # download what gpu_kit.lock (beside it) pins; re-runnable
    python -m fw_research.gpu_node.gpu_kit --check           # resolve the lock for cp312 without downloading it

The kit is one folder: the lock's wheels for CPython 3.12 manylinux x86_64, the sdists that are built on
the node against its own torch (fairseq-fixed, pytorch-fast-transformers), those builds and fw_fairseq's
extensions made here for the node where this machine can (fw_research.gpu_node.gpu_prebuilt; --no-prebuild leaves
them to the node), and MANIFEST.json (file, kind, sha256 of each, and the lock's own digest so the node can tell a
stale kit). Copy it next to the
checkout on the GPU node and run research/fw_research/gpu_node/gpu_check.sh (benchmarks/README.md).
"""
import argparse
import json
import re
import subprocess
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from fw_research.gpu_node import gpu_check, gpu_prebuilt
from fw_research.gpu_node.gpu_prebuilt import file_sha256 as sha256

HERE = Path(__file__).resolve().parent
LOCK, NODE = HERE / "gpu_kit.lock", HERE / "gpu_node.txt"
KINDS = ("wheel", "sdist", "wheel-from-sdist")
MAX_KIT_MIB = 48  # the device tool carries 64 MiB with the checkout; leave room for the tree
# the node: CPython 3.12 on x86-64 Linux; pip matches manylinux tags exactly, so name each one
PLATFORM_FLAGS = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312",
                  *[f for tag in ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
                                  "manylinux1_x86_64") for f in ("--platform", tag)]]
SIMPLE_API = "https://pypi.org/simple/{}/"


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    kind: str
    sha256: str
    why: str


def read_lock(path=LOCK):
    """The lock's pins, checked for shape: one line each, one version of each name."""
    pins = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        fields = line.split(maxsplit=4)
        if len(fields) < 5 or fields[2] not in KINDS or not re.fullmatch(r"[0-9a-f]{64}", fields[3]):
            raise SystemExit(f"{path.name}:{n}: expected 'name version kind sha256 why' with kind one of "
                             f"{', '.join(KINDS)}: {line!r}")
        pins.append(Pin(*fields))
    names = [normalise(p.name) for p in pins]
    if len(set(names)) != len(names):
        raise SystemExit(f"{path.name}: a package is pinned twice")
    return pins


def normalise(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_node(path=NODE):
    """({name: version or None} the node has, {name: reason} declared but never imported)."""
    present, unused = {}, {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        what, rest = line.split(maxsplit=1)
        if what == "present":
            name, _, ver = rest.strip().partition("==")
            present[normalise(name)] = ver or None
        else:
            name, reason = rest.split(maxsplit=1)
            unused[normalise(name)] = reason
    return present, unused


def sdist_link(pin):
    """(url, filename) of pin's sdist from PyPI's JSON simple API, matched by the pinned sha256."""
    request = urllib.request.Request(SIMPLE_API.format(normalise(pin.name)),
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for f in files:
        if f["hashes"].get("sha256") == pin.sha256:
            return f["url"], f["filename"]
    raise SystemExit(f"gpu_kit: no file of {pin.name} {pin.version} on PyPI has the pinned sha256 {pin.sha256}")


def pip(*args):
    subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check", *args], check=True)


def fetch_sdist(pin, dest):
    """Download pin's sdist into dest (skipped when a file with the pinned digest is already there)."""
    url, filename = sdist_link(pin)
    path = dest / filename
    if path.exists() and sha256(path) == pin.sha256:
        return path
    part = path.with_suffix(path.suffix + ".part")  # an interrupted download never looks finished
    with urllib.request.urlopen(url, timeout=300) as response, open(part, "wb") as f:
        f.write(response.read())
    if sha256(part) != pin.sha256:
        part.unlink()
        raise SystemExit(f"gpu_kit: {filename} does not match its pinned sha256 in {LOCK.name}")
    part.rename(path)
    return path


def build(out, prebuild=True):
    """Fill `out` with the kit; files already there with the right digest are kept. prebuild: add the node's
    builds made here (their archives are rebuilt only when what they are built from changed)."""
    pins = read_lock()
    out.mkdir(parents=True, exist_ok=True)
    wheels = [p for p in pins if p.kind == "wheel"]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as req:
        req.write("".join(f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in wheels))
        req.flush()
        pip("download", "--no-deps", "--require-hashes", *PLATFORM_FLAGS, "-d", str(out), "-r", req.name)
    entries = []
    for pin in pins:
        if pin.kind == "wheel":
            prefix = normalise(pin.name).replace("-", "_") + "-" + pin.version + "-"
            [path] = [p for p in out.glob("*.whl") if p.name.lower().startswith(prefix)]
        elif pin.kind == "sdist":
            path = fetch_sdist(pin, out)
        else:  # pure-Python sdist: build its wheel here, where the build backend can be fetched
            with tempfile.TemporaryDirectory() as tmp:
                pip("wheel", "--no-deps", "-w", str(out), str(fetch_sdist(pin, Path(tmp))))
            [path] = out.glob(normalise(pin.name).replace("-", "_") + f"-{pin.version}-*.whl")
        entries.append({"name": pin.name, "version": pin.version, "kind": pin.kind, "file": path.name,
                        "sha256": sha256(path)})
    if prebuild:  # the node's builds, made here where the machine can (fw_research.gpu_node.gpu_prebuilt)
        entries += gpu_prebuilt.build(out, cuda_home=gpu_check.find_cuda_home())
    manifest = {"lock_sha256": sha256(LOCK), "python": "cp312", "platform": "manylinux x86_64", "files": entries}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    stray = sorted({p.name for p in out.iterdir()} - {e["file"] for e in entries} - {"MANIFEST.json"})
    if stray:
        raise SystemExit(f"gpu_kit: {out} holds files the lock does not name (remove them): {', '.join(stray)}")
    mib = sum(p.stat().st_size for p in out.iterdir()) / 2**20
    if mib > MAX_KIT_MIB:
        raise SystemExit(f"gpu_kit: the kit is {mib:.1f} MiB, over its {MAX_KIT_MIB} MiB limit")
    built = sum(e["kind"] == "prebuilt" for e in entries)
    print(f"gpu_kit: {len(entries) - built} packages and {built} prebuilt builds, {mib:.1f} MiB in {out}")


def check(lock=LOCK, node=NODE):
    """Problems with the lock, without downloading it: every wheel resolves for cp312 manylinux x86_64
    with its pinned digest, every sdist exists on PyPI with its digest, and every requirement of the kit
    (including fairseq-fixed's) is met by the kit or by the node (gpu_node.txt)."""
    from packaging.requirements import Requirement  # pip's own dependency; import late for --help

    pins = read_lock(lock)
    present, unused = read_node(node)
    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        req, report = Path(tmp, "req.txt"), Path(tmp, "report.json")
        req.write_text("".join(f"{p.name}=={p.version}\n" for p in pins if p.kind == "wheel"))
        pip("install", "--dry-run", "--ignore-installed", "--no-deps", *PLATFORM_FLAGS, "--target",
            str(Path(tmp, "target")), "--report", str(report), "-r", str(req))
        resolved = json.loads(report.read_text())["install"]
    requires = {}
    for item in resolved:
        name = normalise(item["metadata"]["name"])
        pin = next(p for p in pins if normalise(p.name) == name)
        got = item["download_info"].get("archive_info", {}).get("hashes", {}).get("sha256")
        if got != pin.sha256:
            problems.append(f"{pin.name} {pin.version}: the cp312 file pip picks has sha256 {got}, "
                            f"the lock pins {pin.sha256}")
        requires[name] = item["metadata"].get("requires_dist") or []
    for pin in pins:
        if pin.kind != "wheel":
            sdist_link(pin)  # exits with a clear line if PyPI has no such file
        elif normalise(pin.name) not in requires:
            problems.append(f"{pin.name} {pin.version}: no cp312 manylinux x86_64 wheel resolved")
    requires["fairseq-fixed"] = FAIRSEQ_REQUIRES
    versions = {normalise(p.name): p.version for p in pins} | present
    for owner, reqs in requires.items():
        for line in reqs:
            r = Requirement(line)
            env = {"python_version": "3.12", "implementation_name": "cpython", "extra": ""}
            if r.marker is not None and not r.marker.evaluate(env):
                continue
            name = normalise(r.name)
            if name in unused:
                continue
            if name not in versions:
                problems.append(f"{owner} needs {line}: neither in the kit nor on the node")
            elif versions[name] is not None and not r.specifier.contains(versions[name], prereleases=True):
                problems.append(f"{owner} needs {line}, but the kit or node has {name} {versions[name]}")
    return problems


# fairseq-fixed 0.12.3.1's install_requires (its sdist's PKG-INFO); its sdist is not unpacked here
FAIRSEQ_REQUIRES = ["cffi", "cython", "hydra-core==1.3.2", "omegaconf==2.3.0", "numpy>=1.21.3", "regex",
                    "sacrebleu>=1.4.12", "torch>=1.13", "tqdm", "bitarray", "torchaudio>=0.8.0", "scikit-learn",
                    "packaging"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE.parents[2] / "gpu_kit",
                        help="kit folder (default: gpu_kit/ in the checkout)")
    parser.add_argument("--check", action="store_true", help="resolve the lock for cp312 without downloading")
    parser.add_argument("--no-prebuild", action="store_true", help="leave the node's builds to the node "
                        "(default: build them here, fw_research.gpu_node.gpu_prebuilt)")
    args = parser.parse_args()
    if args.check:
        problems = check()
        print("\n".join(problems) or "gpu_kit: the lock resolves for cp312 manylinux x86_64 and its needs are met")
        sys.exit(1 if problems else 0)
    build(args.out, prebuild=not args.no_prebuild)


if __name__ == "__main__":
    main()
