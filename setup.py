"""fw_fairseq: fast weight programmers (Schlag, Irie & Schmidhuber, ICML 2021) as a fairseq plugin.

The CUDA extension in cuda/ is built only when nvcc and a CUDA build of torch are present;
a CPU install skips it (and says so once) and uses the chunked PyTorch path.
"""
from setuptools import find_packages, setup

setup(
    name="fw_fairseq",
    version="0.1.0",
    description="Linear Transformers as fast weight programmers, as a fairseq plugin",
    packages=find_packages(include=["fw_fairseq", "fw_fairseq.*"]),
    python_requires=">=3.10",
    install_requires=["torch>=2.6", "fairseq-fixed==0.12.3.1", "sacrebleu>=2.0"],
)
