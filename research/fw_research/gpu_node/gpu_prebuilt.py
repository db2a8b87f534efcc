"""Builds made here for the GPU node and carried in the kit, so that its check spends device time on checks.

The node's three builds (gpu_check.py's build_extension, build_fairseq, build_fast_transformers) took 346 of
the 760 seconds of the check's steps on an H200 (benchmarks/results/gpu_h200_2026-11-26). They need no GPU: a
CUDA build of the node's torch (gpu_node.txt beside this module; PyPI's torch 2.11.0 is the node's 2.11.0+cu130), the
same CUDA 13.0 nvcc, CPython 3.12 and the GPU's architecture (Hopper: 9.0a) are enough, and this machine has
all four. So `make gpu-kit` (fw_research.gpu_node.gpu_kit) runs build(): in a CPython 3.12 virtual environment
(.gpu_build/venv, ignored) it compiles each of them as the node's step would and adds it to the kit as
prebuilt-<step>.tar.gz, recorded in MANIFEST.json with the digest of the files it was built from, the torch,
Python and architecture. On the node, gpu_check.py calls unpack() before each build step: an archive made from
the same files for the node's torch, Python and GPU is unpacked and imported, and the step is recorded as
"prebuilt"; anything else (another commit's csrc/cuda/, an import error) and the step builds there as before.
The same holds for Triton's kernel cache of the fused read (gpu_check.py's warm_triton): compiled here for the GPU's
architecture by fw_research.gpu_node.gpu_triton_cache in the build venv, whose Triton is the node's, and checked on the
node against its Triton version as well.
"""
import glob
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from fw_research.gpu_node.gpu_triton_cache import relocate

REPO = Path(__file__).resolve().parents[3]
ARCH = "9.0a"  # H100 and H200 (capability 9.0); torch builds them as sm_90a
PYTHON = "3.12"
# what the node's own builds compile against besides torch (gpu_node.txt has its numpy 2.5.x)
BUILD_PINS = ["numpy==2.5.2", "cython==3.3.1", "setuptools==81.0.0", "wheel==0.48.0", "ninja==1.13.2"]


def digest(*paths):
    """One sha256 over the given files (sorted), to stamp what a build was made from."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def sdist(kit, step):
    """The kit's sdist that `step` builds (a path that does not exist when the kit lacks it)."""
    pattern = ITEMS[step].sdist
    return (sorted(kit.glob(pattern)) or [kit / pattern.replace("*", "<missing>")])[0]


def sources(step, repo, kit):
    """The files a build step's result depends on: the item's own list, the kit's sdist it builds, else fw_fairseq's
    extension sources (build_ext builds both extensions: the CUDA kernels and the CPU one)."""
    if ITEMS[step].files is not None:
        return ITEMS[step].files(repo)
    if ITEMS[step].sdist is None:
        return [*(repo / "csrc" / "cuda").iterdir(), *(repo / "csrc" / "cpu").iterdir(), repo / "setup.py"]
    path = sdist(kit, step)
    return [path] if path.exists() else []


# ------------------------------------------------------------------ the node: unpack


def unpack(step, kit, repo, site, node, env):
    """(True, what was unpacked) where the kit holds `step`'s build for these files and this node
    ({"torch": version, "capability": "9.0"}), unpacked and importable; else (False, why not)."""
    manifest = kit / "MANIFEST.json"
    entries = json.loads(manifest.read_text()).get("files", []) if manifest.exists() else []
    entry = next((e for e in entries if e.get("kind") == "prebuilt" and e.get("step") == step), None)
    if entry is None:
        return False, "the kit has no prebuilt build"
    archive, files = kit / entry["file"], sources(step, repo, kit)
    python = ".".join(map(str, sys.version_info[:2]))
    checks = [("torch", node.get("torch"), entry["torch"]), ("Python", python, entry["python"]),
              ("GPU capability", node.get("capability"), entry["arch"].rstrip("a"))]
    if "triton" in entry:  # a kernel cache fits the Triton build that made it, and no other
        checks.append(("Triton", node.get("triton"), entry["triton"]))
    for what, have, want in checks:
        if have != want:
            return False, f"built for {what} {want}, this node has {have}"
    if not files or digest(*files) != entry["from"]:
        return False, "built from other files than this checkout's and kit's"
    if not archive.exists() or file_sha256(archive) != entry["sha256"]:
        return False, f"{entry['file']} is missing or does not match its sha256"
    item = ITEMS[step]
    dest = (site if item.under_site else repo) / item.folder
    if item.on_sdist:  # a fresh tree of the sdist, as the step's build starts from
        shutil.rmtree(dest, ignore_errors=True)
        extract(files[0], dest, strip=1)
    extract(archive, dest)
    if item.fixup is not None:
        item.fixup(dest)
    proc = subprocess.run([sys.executable, "-c", item.smoke], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=180)
    if proc.returncode != 0:
        return False, f"unpacked, but `{item.smoke}` failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return True, f"{entry['file']} unpacked into {dest} (built against torch {entry['torch']}, CUDA arch {ARCH})"


def extract(archive, dest, strip=0):
    """Unpack a .tar.gz into dest, dropping `strip` leading path components."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            parts = Path(member.name).parts[strip:]
            if parts:
                member.name = str(Path(*parts))
                members.append(member)
        tar.extractall(dest, members=members, filter="data")


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------ here: build


def find_python():
    """A CPython 3.12 interpreter here (FW_KIT_PYTHON, python3.12, pyenv's), or None."""
    home = Path.home()
    candidates = [os.environ.get("FW_KIT_PYTHON"), shutil.which("python3.12"),
                  *sorted(glob.glob(str(home / ".pyenv" / "versions" / "3.12*" / "bin" / "python3.12")), reverse=True),
                  "/usr/bin/python3.12"]
    for python in filter(None, candidates):
        ok = subprocess.run([python, "-c", "import sys, venv; assert sys.version_info[:2] == (3, 12)"],
                            capture_output=True).returncode == 0
        if ok:
            return python
    return None


def node_torch(node_file):
    """The torch version the node has (gpu_node.txt's `present torch==X`)."""
    for line in node_file.read_text().splitlines():
        if line.startswith("present torch=="):
            return line.split("==", 1)[1].strip()
    raise SystemExit(f"gpu_prebuilt: {node_file} names no `present torch==VERSION`")


def venv(python, folder, torch_version):
    """The build environment's python: folder's venv with the node's torch and BUILD_PINS (made once)."""
    py = folder / "bin" / "python"
    want = f"torch=={torch_version} " + " ".join(BUILD_PINS)
    stamp = folder / ".pins"
    if not (py.exists() and stamp.exists() and stamp.read_text() == want):
        shutil.rmtree(folder, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(folder)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", *want.split()],
                       check=True)
        stamp.write_text(want)
    return py


def build_env(cuda_home):
    env = dict(os.environ, TORCH_CUDA_ARCH_LIST=ARCH, MAX_JOBS=str(os.cpu_count() or 2))
    env.pop("PYTHONPATH", None)
    return dict(env, CUDA_HOME=cuda_home) if cuda_home else env


def research_env(env, repo):
    """env with the checkout and its research package on the path: the build venv installs neither."""
    return dict(env, PYTHONPATH=os.pathsep.join([str(repo), str(repo / "research")]))


def build_extension(py, repo, kit, work, env):
    """fw_fairseq's two extensions, built in a copy of what setup.py reads; -> the modules' paths under work."""
    for name in ("csrc", "fw_fairseq", "hydra_plugins"):
        shutil.copytree(repo / name, work / name, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy2(repo / "setup.py", work / "setup.py")
    subprocess.run([str(py), "setup.py", "-q", "build_ext", "--inplace"], cwd=work, env=env, check=True)
    built = sorted(p.relative_to(work) for p in (work / "fw_fairseq").glob("_*.so"))
    if len([p for p in built if p.name.startswith(("_cuda.", "_cpu."))]) != 2:
        raise RuntimeError(f"setup.py built {[str(p) for p in built]}, not both _cuda and _cpu")
    return built


def build_fairseq(py, repo, kit, work, env):
    """fairseq-fixed's extensions in its unpacked sdist, CUDA_HOME unset as on the node (its CPU extensions)."""
    extract(sdist(kit, "build_fairseq"), work, strip=1)
    env = {k: v for k, v in env.items() if k != "CUDA_HOME"}
    subprocess.run([str(py), "setup.py", "-q", "build_ext", "--inplace"], cwd=work, env=env, check=True)
    return sorted(p.relative_to(work) for p in work.rglob("*.so") if p.relative_to(work).parts[0] != "build")


def build_fast_transformers(py, repo, kit, work, env):
    """fast-transformers' causal_product, by the node's own script, into work/fast_transformers."""
    subprocess.run([str(py), "-m", "fw_research.gpu_node.gpu_build_peer", str(sdist(kit, "build_fast_transformers")),
                    str(work)], env=research_env(env, repo), check=True)
    return [Path("fast_transformers")]


def triton_sources(repo):
    """What the fused read's compiled kernels depend on: its dispatch and launches, the rules' kernels, the
    benchmark's cases (the shapes they are compiled for) and the script that compiles them."""
    research = repo / "research" / "fw_research"
    return [*sorted((repo / "fw_fairseq" / "ops" / "fused_read").glob("*.py")),
            *sorted((repo / "fw_fairseq" / "ops" / "rules").glob("*/fused*.py")),
            research / "experiments" / "fused_read_cases.py", research / "benchmarks" / "bench_fused_read_gpu.py",
            research / "gpu_node" / "gpu_triton_cache.py"]


def build_triton_cache(py, repo, kit, work, env):
    """The fused read's kernels compiled for the node (fw_research.gpu_node.gpu_triton_cache), or None where they do
    not compile here: the kit then carries no cache and the node compiles them in its warm_triton step."""
    proc = subprocess.run([str(py), "-m", "fw_research.gpu_node.gpu_triton_cache", "--cache", str(work)],
                          env=research_env(env, repo), capture_output=True, text=True)
    if proc.returncode != 0:
        print("gpu_prebuilt: the fused read's kernels did not compile here, the node compiles them:\n"
              + "\n".join(proc.stderr.strip().splitlines()[-3:]))
        return None
    print(proc.stdout.strip().splitlines()[-1])
    return sorted(p.relative_to(work) for p in work.iterdir())


@dataclass(frozen=True)
class Item:
    sdist: Optional[str]  # the kit's sdist it is built from (a glob), or None: fw_fairseq's own sources
    smoke: str  # what the node imports before it trusts the unpacked files
    under_site: bool  # unpacked into .gpu_site/ (else into the checkout)
    folder: str  # the folder under that root the archive's paths start from ("" for the root itself)
    on_sdist: bool  # unpacked on top of a fresh tree of its sdist (fairseq runs from its source tree)
    build: Callable  # (build python, repo, kit, work folder, env) -> the archive's paths under work (None: not here)
    files: Optional[Callable] = None  # repo -> the files it is built from, where neither the sdist nor csrc/
    fixup: Optional[Callable] = None  # dest -> None: what the unpacked files need on the node


ITEMS = {
    "build_extension": Item(None, "import fw_fairseq._cuda, fw_fairseq._cpu", False, "", False, build_extension),
    "build_fairseq": Item("fairseq_fixed-*.tar.gz",
                          "import fairseq.libbleu, fairseq.data.data_utils_fast, fairseq.data.token_block_utils_fast",
                          True, "fairseq-src", True, build_fairseq),
    "build_fast_transformers": Item("pytorch-fast-transformers-*.tar.gz",
                                    "from fast_transformers.causal_product import causal_dot_product", True, "", False,
                                    build_fast_transformers),
    "warm_triton": Item(None, "import triton", True, "triton_cache", False, build_triton_cache, files=triton_sources,
                        fixup=relocate),
}


def pack(step, py, repo, kit, archive, cuda_home):
    """Build `step` in a temporary folder and pack what it made into archive; False where it built nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        paths = ITEMS[step].build(py, repo, kit, root, build_env(cuda_home))
        if paths is None:
            archive.unlink(missing_ok=True)
            return False
        # setuptools compiles with -g: the debug sections are 80-95% of each module (fw_fairseq._cpu 54 MB,
        # 3.5 MB without), past the kit's size limit (gpu_kit.MAX_KIT_MIB); the node's own builds keep them, unused
        for module in root.rglob("*.so"):
            subprocess.run(["strip", "--strip-debug", str(module)], check=True)
        with tarfile.open(archive, "w:gz") as tar:
            for path in paths:
                tar.add(root / path, arcname=str(path))
    return True


def build(kit, repo=REPO, node_file=None, cuda_home=None):
    """The kit's prebuilt entries (MANIFEST.json "files" rows), building what the kit lacks; [] with one line
    where this machine cannot (no CPython 3.12 or nvcc): the node then builds, as without them."""
    python = find_python()
    if python is None or not cuda_home:
        print(f"gpu_prebuilt: no {'CPython 3.12 (set FW_KIT_PYTHON)' if python is None else 'CUDA toolkit'} here:"
              " the kit carries no prebuilt builds, the node builds them")
        return []
    torch_version = node_torch(node_file or repo / "tools" / "gpu_node" / "gpu_node.txt")
    manifest = kit / "MANIFEST.json"
    old = {e.get("step"): e for e in json.loads(manifest.read_text()).get("files", [])} if manifest.exists() else {}
    py, torch_built, entries = None, None, []
    for step in ITEMS:
        files = sources(step, repo, kit)
        entry = {"name": f"prebuilt {step}", "version": torch_version, "kind": "prebuilt", "step": step,
                 "file": f"prebuilt-{step}.tar.gz", "from": digest(*files), "python": PYTHON, "arch": ARCH}
        archive = kit / entry["file"]
        kept = old.get(step, {})
        if (archive.exists() and all(kept.get(k) == entry[k] for k in ("from", "version", "python", "arch"))
                and kept.get("sha256") == file_sha256(archive)):
            entries.append(kept)
            continue
        if py is None:  # the build environment, and the torch version it reports (the node's "+cu130" one)
            py = venv(python, repo / ".gpu_build" / "venv", torch_version)
            torch_built = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"],
                                         capture_output=True, text=True, check=True).stdout.strip()
        print(f"gpu_prebuilt: building {step} for CPython {PYTHON}, CUDA arch {ARCH}", flush=True)
        if pack(step, py, repo, kit, archive, cuda_home):
            versions = {"torch": torch_built}
            if step == "warm_triton":  # the cache fits this Triton only: the node checks it (unpack)
                versions["triton"] = subprocess.run([str(py), "-c", "import triton; print(triton.__version__)"],
                                                    capture_output=True, text=True, check=True).stdout.strip()
            entries.append(dict(entry, **versions, sha256=file_sha256(archive)))
    return entries
