"""fw_fairseq: fast weight programmers (Schlag, Irie & Schmidhuber, ICML 2021) as a fairseq plugin.

The CUDA extension in csrc/cuda/ is built only when nvcc and a CUDA build of torch are present;
a CPU install skips it (and says so once) and uses the chunked PyTorch path.
The CPU extension in csrc/cpu/ (DPFP's fused forward and backward, the decoding cache's scores and state
step) is built wherever torch is importable
at build time and a C++ compiler is found; without one (or if it fails to compile) the install goes
on and those ops use their PyTorch forms (fw_fairseq/ops/kernels/cpu_extension.py).
"""
import glob
import os
import shutil

from setuptools import find_namespace_packages, find_packages, setup


def cuda_extension():
    """(ext_modules, cmdclass) for fw_fairseq._cuda, or ([], {}) with one line saying why not.

    Target GPUs follow torch's TORCH_CUDA_ARCH_LIST (default: the GPUs visible at build time).
    """
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return _skip("torch is not importable at build time (install torch first, then --no-build-isolation)")
    if torch.version.cuda is None:
        return _skip(f"torch {torch.__version__} is a CPU build")
    nvcc = os.path.join(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        return _skip("nvcc was not found (set CUDA_HOME)")
    here = os.path.dirname(os.path.abspath(__file__))
    cuda_dir = os.path.join("csrc", "cuda")
    sources = sorted(glob.glob(os.path.join(cuda_dir, "*.cpp")) + glob.glob(os.path.join(cuda_dir, "*.cu")))
    ext = CUDAExtension(
        name="fw_fairseq._cuda",
        sources=sources,
        include_dirs=[os.path.join(here, cuda_dir)],
        extra_compile_args={"cxx": ["-O3"], "nvcc": ["-O3", "-lineinfo"]},
    )
    return [ext], {"build_ext": BuildExtension}


def cpu_extension():
    """(ext_modules, cmdclass) for fw_fairseq._cpu, or ([], {}) with one line saying why not.

    A compile error skips it (OptionalBuild); a missing compiler is checked here, because torch's
    BuildExtension runs the compiler for its ABI check before any extension is built, and that
    failure would stop the whole install."""
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        return _skip_cpu("torch is not importable at build time")
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return _skip_cpu(f"no C++ compiler ({compiler}) was found")
    class OptionalBuild(BuildExtension):
        """setuptools skips an optional extension on a CompileError only; torch's ninja build raises
        RuntimeError, so the skip is made here, for optional extensions alone."""

        def build_extension(self, ext):
            try:
                super().build_extension(ext)
            except Exception as err:  # noqa: BLE001  (whatever the compiler driver raised)
                if not ext.optional:
                    raise
                _skip_cpu(f"it failed to compile ({type(err).__name__})")

    cpu_dir = os.path.join("csrc", "cpu")
    ext = CppExtension(name="fw_fairseq._cpu", sources=sorted(glob.glob(os.path.join(cpu_dir, "*.cpp"))),
                       depends=glob.glob(os.path.join(cpu_dir, "*.h")),
                       extra_compile_args=["-O3", "-fopenmp", "-Wno-psabi"], optional=True)
    return [ext], {"build_ext": OptionalBuild}


def _skip_cpu(reason):
    print(f"fw_fairseq: CPU extension skipped: {reason}; its ops use their PyTorch forms")
    return [], {}


def _skip(reason):
    print(f"fw_fairseq: CUDA extension skipped: {reason}; CUDA tensors use the chunked PyTorch path")
    return [], {}


ext_modules, cmdclass = cuda_extension()
cpu_modules, cpu_cmdclass = cpu_extension()
ext_modules, cmdclass = ext_modules + cpu_modules, {**cmdclass, **cpu_cmdclass}

setup(
    name="fw_fairseq",
    version="0.1.0",
    description="Linear Transformers as fast weight programmers, as a fairseq plugin",
    # hydra_plugins/ loads the plugin into fairseq's CLIs when --user-dir is left out (see its docstring)
    packages=find_packages(include=["fw_fairseq", "fw_fairseq.*"]) + find_namespace_packages(include=["hydra_plugins.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.6", "fairseq-fixed==0.12.3.1", "sacrebleu>=2.0"],
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
