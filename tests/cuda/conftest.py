import shutil

import pytest
import torch

import emulated_ext


@pytest.fixture(scope="session")
def emulated(tmp_path_factory):
    """csrc/cuda/'s kernels on the CPU (float64) behind fw_fairseq._cuda's interface."""
    if shutil.which("g++") is None:
        pytest.skip("g++ not found: cannot build the CPU emulation of the kernels")
    return emulated_ext.build(tmp_path_factory.mktemp("emulator"))


@pytest.fixture(scope="session")
def compiled():
    """The real extension, fw_fairseq._cuda, when a GPU and the built extension are both present."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    try:
        from fw_fairseq import _cuda
    except ImportError as err:
        pytest.skip(f"fw_fairseq._cuda is not built ({err}); build it with pip install -e . on a CUDA machine")
    return _cuda

