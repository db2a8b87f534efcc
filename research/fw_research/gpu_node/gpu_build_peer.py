"""Build fast-transformers' causal dot product (the peer's sum-rule kernel) from its sdist into a folder.

    python -m fw_research.gpu_node.gpu_build_peer gpu_kit/pytorch-fast-transformers-0.4.0.tar.gz .gpu_site

Only `fast_transformers.causal_product` is built: its setup.py compiles every CUDA extension with
`-arch=compute_50`, which CUDA 13's nvcc no longer accepts, and the benchmark needs none of the others.
The kernel source is theirs, unchanged; it is compiled for this machine's GPU (or TORCH_CUDA_ARCH_LIST).
The Python package is copied whole, so `from fast_transformers.causal_product import causal_dot_product`
works as after their own install.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SETUP = """
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension
setup(name="fast_transformers_causal_product", ext_modules=[
    CppExtension("fast_transformers.causal_product.causal_product_cpu",
                 ["fast_transformers/causal_product/causal_product_cpu.cpp"], extra_compile_args=["-fopenmp"]),
    CUDAExtension("fast_transformers.causal_product.causal_product_cuda",
                  ["fast_transformers/causal_product/causal_product_cuda.cu"]),
], cmdclass={"build_ext": BuildExtension})
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sdist", type=Path)
    parser.add_argument("site", type=Path, help="folder on PYTHONPATH that receives fast_transformers/")
    args = parser.parse_args()
    if not args.sdist.is_file():
        raise SystemExit(f"gpu_build_peer: {args.sdist} does not exist; run `make gpu-kit` and copy gpu_kit/")
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.sdist) as tar:
            tar.extractall(tmp, filter="data")
        [src] = Path(tmp).iterdir()
        (src / "setup_causal.py").write_text(SETUP)
        env = dict(os.environ, MAX_JOBS=str(os.cpu_count() or 4))
        subprocess.run([sys.executable, "setup_causal.py", "-q", "build_ext", "--inplace"], cwd=src, env=env,
                       check=True)
        dest = args.site / "fast_transformers"
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(src / "fast_transformers", dest)
    print(f"gpu_build_peer: fast_transformers.causal_product built into {dest}")


if __name__ == "__main__":
    main()
