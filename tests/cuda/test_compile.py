"""Every source in cuda/ compiles with nvcc, as setup.py would build it (same torch headers and flags),
for Hopper (sm_90). Runs wherever nvcc exists, GPU or not. One architecture keeps the test near a
minute on two cores; FW_COMPILE_ARCHS="90 80" checks more (the kernels use nothing beyond sm_70).

A CPU build of torch ships the CUDA headers of c10 but not the one header CMake generates for a CUDA
build (c10/cuda/impl/cuda_cmake_macros.h); the test supplies it in a temporary include directory.
"""
import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils import cpp_extension

CUDA_DIR = Path(__file__).resolve().parents[2] / "cuda"
NVCC = shutil.which("nvcc")
ARCHS = os.environ.get("FW_COMPILE_ARCHS", "90").split()

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def _include_flags(tmp_path):
    includes = [str(CUDA_DIR), *cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    generated = Path("c10", "cuda", "impl", "cuda_cmake_macros.h")
    if not any((Path(d) / generated).exists() for d in includes):
        (tmp_path / generated).parent.mkdir(parents=True)
        (tmp_path / generated).write_text("#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
        includes.append(str(tmp_path))
    return [f"-I{d}" for d in includes]


def _compile(source, flags, out_dir):
    cmd = [NVCC, "-c", str(source), "-o", str(out_dir / (source.name + ".o")), *flags]
    if source.suffix == ".cu":
        cmd += cpp_extension.COMMON_NVCC_FLAGS
        cmd += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    else:  # the binding is host code: nvcc hands it to the host compiler with the CUDA include path
        cmd += ["-DTORCH_EXTENSION_NAME=_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    return source.name, subprocess.run(cmd, capture_output=True, text=True)


def test_every_cuda_source_compiles(tmp_path):
    sources = sorted(CUDA_DIR.glob("*.cu")) + sorted(CUDA_DIR.glob("*.cpp"))
    assert {s.name for s in sources} >= {"columns.cu", "rows.cu", "step.cu", "fast_weight.cpp"}
    flags = ["-std=c++20", *_include_flags(tmp_path)]  # device code is optimised by default, host at -O0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = list(pool.map(lambda s: _compile(s, flags, tmp_path), sources))
    failed = {name: r.stderr[-3000:] for name, r in results if r.returncode != 0}
    assert not failed, failed
