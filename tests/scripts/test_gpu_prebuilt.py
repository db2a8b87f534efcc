"""The node's side of the kit's prebuilt builds (fw_research.gpu_node.gpu_prebuilt), without a GPU: an archive made from
the same files for the node's torch, Python and GPU is unpacked and imported; any other is refused with its
reason and the step builds. Stand-ins for the compiled modules are Python modules of the same names, imported
the same way; the builds themselves are made by `make gpu-kit` and checked on the node (pytest tests/cuda)."""
import json
import sys
import tarfile
from types import SimpleNamespace

import pytest
from conftest import add_member

from fw_research.gpu_node import gpu_check, gpu_prebuilt

NODE = {"torch": "2.11.0+cu130", "capability": "9.0"}
PYTHON = ".".join(map(str, sys.version_info[:2]))


def tar_gz(path, files):
    """A .tar.gz at path holding {name: text}."""
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            add_member(tar, name, text.encode())
    return path


def make_kit(tmp_path, step, archive_files, **entry):
    """A checkout with extension sources, a site, and a kit whose MANIFEST records `step`'s archive."""
    repo, site, kit = tmp_path / "repo", tmp_path / "site", tmp_path / "kit"
    for name, text in {"csrc/cuda/rows.cu": "kernel", "csrc/cpu/dpfp.cpp": "rows", "setup.py": "setup()",
                       "fw_fairseq/__init__.py": ""}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    kit.mkdir()
    tar_gz(kit / "fairseq_fixed-0.12.3.1.tar.gz", {"fairseq_fixed-0.12.3.1/fairseq/__init__.py": "",
                                                   "fairseq_fixed-0.12.3.1/fairseq/data/__init__.py": ""})
    archive = tar_gz(kit / f"prebuilt-{step}.tar.gz", archive_files)
    row = {"kind": "prebuilt", "step": step, "file": archive.name, "sha256": gpu_prebuilt.file_sha256(archive),
           "from": gpu_prebuilt.digest(*gpu_prebuilt.sources(step, repo, kit)), "torch": NODE["torch"],
           "python": PYTHON, "arch": "9.0a"}
    (kit / "MANIFEST.json").write_text(json.dumps({"files": [dict(row, **entry)]}))
    return repo, site, kit


EXTENSION = {"fw_fairseq/_cuda.py": "", "fw_fairseq/_cpu.py": ""}


def unpack(step, repo, site, kit, node=NODE):
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(site / "fairseq-src")}
    return gpu_prebuilt.unpack(step, kit, repo, site, node, env)


def test_a_matching_extension_build_is_unpacked_and_imported(tmp_path):
    repo, site, kit = make_kit(tmp_path, "build_extension", EXTENSION)
    used, why = unpack("build_extension", repo, site, kit)
    assert used, why
    assert "prebuilt-build_extension.tar.gz unpacked" in why and (repo / "fw_fairseq" / "_cuda.py").exists()


def test_fairseq_is_its_sdist_with_the_compiled_modules_on_top(tmp_path):
    built = {"fairseq/libbleu.py": "", "fairseq/data/data_utils_fast.py": "",
             "fairseq/data/token_block_utils_fast.py": ""}
    repo, site, kit = make_kit(tmp_path, "build_fairseq", built)
    (site / "fairseq-src" / "stale.py").parent.mkdir(parents=True)
    (site / "fairseq-src" / "stale.py").write_text("")  # an earlier tree is replaced, as the build step does
    used, why = unpack("build_fairseq", repo, site, kit)
    assert used, why
    tree = site / "fairseq-src"
    assert (tree / "fairseq" / "__init__.py").exists() and (tree / "fairseq" / "libbleu.py").exists()
    assert not (tree / "stale.py").exists()


@pytest.mark.parametrize("change, reason", [
    ({"torch": "2.12.0+cu130"}, "built for torch 2.12.0+cu130, this node has 2.11.0+cu130"),
    ({"python": "3.99"}, f"built for Python 3.99, this node has {PYTHON}"),
    ({"arch": "10.0a"}, "built for GPU capability 10.0, this node has 9.0"),
    ({"from": "0" * 64}, "built from other files than this checkout's and kit's"),
    ({"sha256": "0" * 64}, "prebuilt-build_extension.tar.gz is missing or does not match its sha256"),
])
def test_a_build_for_anything_else_is_refused_with_its_reason(tmp_path, change, reason):
    repo, site, kit = make_kit(tmp_path, "build_extension", EXTENSION, **change)
    assert unpack("build_extension", repo, site, kit) == (False, reason)
    assert not (repo / "fw_fairseq" / "_cuda.py").exists()


def test_a_node_without_cuda_builds(tmp_path):
    repo, site, kit = make_kit(tmp_path, "build_extension", EXTENSION)
    assert unpack("build_extension", repo, site, kit, node={"torch": NODE["torch"]}) == (
        False, "built for GPU capability 9.0, this node has None")


def test_a_build_that_does_not_import_is_refused(tmp_path):
    broken = dict(EXTENSION, **{"fw_fairseq/_cuda.py": "raise ImportError('libcudart.so.13: cannot open')"})
    repo, site, kit = make_kit(tmp_path, "build_extension", broken)
    used, why = unpack("build_extension", repo, site, kit)
    assert not used and why.endswith("failed: ImportError: libcudart.so.13: cannot open")


def test_the_check_records_why_a_step_built(tmp_path):
    """gpu_check.py asks the kit before each build step and records the answer beside the step."""
    check = SimpleNamespace(kit=tmp_path, site=tmp_path / "site", env={}, record={"environment": NODE})
    entry = {}
    assert gpu_check.Check.prebuilt(check, gpu_check.STEPS[3], entry) is False
    assert gpu_check.STEPS[3].name == "build_extension" and entry == {"prebuilt": "the kit has no prebuilt build"}
    pytest_cuda = next(step for step in gpu_check.STEPS if step.name == "pytest_cuda")
    assert gpu_check.Check.prebuilt(check, pytest_cuda, entry := {}) is False and entry == {}


def test_a_machine_without_python_3_12_makes_the_kit_without_builds(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_prebuilt, "find_python", lambda: None)
    assert gpu_prebuilt.build(tmp_path, cuda_home="/usr/local/cuda") == []
    assert "no CPython 3.12 (set FW_KIT_PYTHON) here: the kit carries no prebuilt builds" in capsys.readouterr().out


def test_a_prebuilt_step_is_stamped_so_the_next_part_skips_it(tmp_path, monkeypatch):
    """The check's bookkeeping around unpack() (tested above on real archives): a step the kit stood in for
    is stamped like a build, so the second part on the same machine does not unpack it again."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "MANIFEST.json").write_text("{}")
    check = gpu_check.Check(gpu_check.parse_args(["--part", "kernels", "--kit", str(kit), "--out",
                                                  str(tmp_path / "out"), "--budget-s", "600"]))
    stamp = tmp_path / "stamp"
    monkeypatch.setattr(check, "stamps", lambda: {"build_extension": (stamp, "built from these files")})
    monkeypatch.setattr(gpu_check, "unpack", lambda *args: (True, "unpacked"))
    step = next(s for s in gpu_check.STEPS if s.name == "build_extension")
    check.run([step])
    check.run([step])
    assert [s["status"] for s in check.record["steps"]] == ["prebuilt", "cached"]
    assert stamp.read_text() == "built from these files"
