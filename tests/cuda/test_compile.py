"""Every source in csrc/cuda/ compiles with nvcc, as setup.py would build it (same torch headers and flags),
for Hopper (sm_90). Runs wherever nvcc exists, GPU or not. One architecture keeps the test near a
minute on two cores; FW_COMPILE_ARCHS="90 80" checks more (the kernels use nothing beyond sm_70).

The same compilation reports ptxas's resource use (-Xptxas -v), from which the second test checks
what only a launch would otherwise show ("too many resources requested for launch"): every kernel
instantiation the launchers can launch fits the register file at its largest block, and its static
shared memory fits the 48 KiB a launch gets without an opt-in.

A CPU build of torch ships the CUDA headers of c10 but not the one header CMake generates for a CUDA
build (c10/cuda/impl/cuda_cmake_macros.h); the test supplies it in a temporary include directory.
"""
import math
import os
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils import cpp_extension

CUDA_DIR = Path(__file__).resolve().parents[2] / "csrc" / "cuda"
NVCC = shutil.which("nvcc")
ARCHS = os.environ.get("FW_COMPILE_ARCHS", "90").split()

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

# Largest block each kernel (a name in the mangled symbol) is launched with: col_kernel and
# delta_rows_kernel kColWarps / kRowWarps (4) warps, also their __launch_bounds__; step_kernel
# groups * M threads, at most 1024 by the TORCH_CHECK in csrc/cuda/step.cu (381 at M <= 160). A kernel
# missing here fails the test, so that a new one gets its bound.
MAX_THREADS = {"col_kernel": 128, "delta_rows_kernel": 128, "step_kernel": 1024}
REGISTER_FILE = 65536  # 32-bit registers per SM, and so per block, on sm_70 .. sm_90
REGISTER_UNIT = 256  # registers are allocated per warp in units of 256
STATIC_SMEM_LIMIT = 48 * 1024  # without cudaFuncSetAttribute; the step kernel's dynamic smem is checked
# in test_kernels.py::test_step_launch_fits_every_accepted_shape
# Instantiations per architecture that the launchers can launch, 4 dtypes each (fp16, bf16, fp32, fp64):
# col_kernel 9 register tiers x 5 ColModes (sum, delta, delta grad, gated delta, gated delta grad);
# delta_rows_kernel 5 tiers x 2 sweeps x ungated/gated; step_kernel sum, delta, gated delta.
INSTANTIATIONS = {"col_kernel": 4 * 9 * 5, "delta_rows_kernel": 4 * 5 * 2 * 2, "step_kernel": 4 * 3}


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
        cmd += cpp_extension.COMMON_NVCC_FLAGS + ["-Xptxas", "-v"]
        cmd += [f"-gencode=arch=compute_{a},code=sm_{a}" for a in ARCHS]
    else:  # the binding is host code: nvcc hands it to the host compiler with the CUDA include path
        cmd += ["-DTORCH_EXTENSION_NAME=_cuda", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    return source.name, subprocess.run(cmd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{source name: nvcc's CompletedProcess} for every source in csrc/cuda/, compiled once for both tests."""
    tmp_path = tmp_path_factory.mktemp("nvcc")
    sources = sorted(CUDA_DIR.glob("*.cu")) + sorted(CUDA_DIR.glob("*.cpp"))
    assert {s.name for s in sources} >= {"columns.cu", "columns_sum.cu", "columns_delta.cu", "columns_gated.cu", "rows.cu", "step.cu", "fast_weight.cpp"}
    flags = ["-std=c++20", *_include_flags(tmp_path)]  # device code is optimised by default, host at -O0
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(pool.map(lambda s: _compile(s, flags, tmp_path), sources))


def test_every_cuda_source_compiles(builds):
    failed = {name: r.stderr[-3000:] for name, r in builds.items() if r.returncode != 0}
    assert not failed, failed


def ptxas_resources(log):
    """[(mangled kernel, arch, registers, static smem bytes, spill bytes)] from ptxas -v output."""
    kernels, entry = [], None
    for line in log.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)' for '(sm_\d+)'", line):
            entry, spill = m.groups(), 0
        elif m := re.search(r"(\d+) bytes spill stores", line):
            spill = int(m.group(1))
        elif entry and (m := re.search(r"Used (\d+) registers", line)):
            smem = re.search(r"(\d+) bytes smem", line)
            kernels.append((*entry, int(m.group(1)), int(smem.group(1)) if smem else 0, spill))
            entry = None
    return kernels


def test_launched_kernels_fit_the_register_file_and_shared_memory(builds):
    """ptxas's registers x the kernel's largest block within the register file, per instantiation."""
    if any(r.returncode != 0 for r in builds.values()):
        pytest.skip("a source does not compile (see test_every_cuda_source_compiles)")
    kernels = [k for name, r in builds.items() if name.endswith(".cu") for k in ptxas_resources(r.stderr)]
    seen, problems = set(), []
    for mangled, arch, regs, smem, _spill in kernels:
        family = [f for f in MAX_THREADS if re.search(rf"\d{f}I", mangled)]  # <length><name>I<template args>
        if len(family) != 1:
            problems.append(f"{mangled}: no thread bound in MAX_THREADS")
            continue
        seen.add(family[0])
        warps = math.ceil(MAX_THREADS[family[0]] / 32)
        block_regs = warps * math.ceil(regs * 32 / REGISTER_UNIT) * REGISTER_UNIT
        if block_regs > REGISTER_FILE:
            problems.append(f"{mangled} ({arch}): {regs} registers x {MAX_THREADS[family[0]]} threads")
        if smem > STATIC_SMEM_LIMIT or (family[0] == "step_kernel" and smem):
            problems.append(f"{mangled} ({arch}): {smem} bytes of static shared memory")
    assert seen == set(MAX_THREADS), f"ptxas reported no {set(MAX_THREADS) - seen}: output format changed?"
    assert not problems, problems
    for arch in {arch for _, arch, *_ in kernels}:  # every instantiation was compiled, and so checked above
        counts = {f: sum(bool(re.search(rf"\d{f}I", m)) for m, a, *_ in kernels if a == arch) for f in MAX_THREADS}
        assert counts == INSTANTIATIONS, (arch, counts)
