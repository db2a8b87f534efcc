"""The compiled CPU extension fw_fairseq._cpu (setup.py builds csrc/cpu/*.cpp into it, wherever a C++ compiler
was there at install time), for the ops that have a kernel there: DPFP's forward and backward and its
scores from raw keys (maps/dpfp_function.py), a short sequence's read from raw heads (rules/raw_read.py), the rules'
in-place decoding steps (rules/<rule>/step.py) and generation's steps of the lazy cache (fw_fairseq/decoding). Each
op also has a PyTorch form, the same function, which runs where the extension was not built or does not take the
tensors (not on the CPU, or neither float32 nor float64).
"""
import torch

_KERNEL_DTYPES = (torch.float32, torch.float64)
KERNEL_NORMS = {None: 0, "sum": 1, "l2": 2}  # the normalisations of phi as the kernels take them (fw::Norm)
KERNEL_MAPS = {"dpfp": 0, "elu": 1, "hedgehog": 2, "favor": 3}  # the maps with a row form there (fw::Map, map_rows.h)
_cpu = None  # fw_fairseq._cpu once imported, False where it is not built
# The short reads' products call BLAS where the loaded torch exports it (feature_attend_blas()), else the kernel's
# own loops; False takes the loops anyway (the tests run both)
BLAS = True


def cpu_kernel(x):
    """The compiled CPU extension if it is built and takes x (a float32 or float64 CPU tensor), else None;
    None while torch.compile traces too, as its pybind functions cannot be traced: the PyTorch forms run."""
    if torch.compiler.is_compiling():
        return None
    global _cpu
    if _cpu is None:
        try:
            from fw_fairseq import _cpu as extension
            _cpu = extension
        except ImportError:
            _cpu = False
    return _cpu if _cpu and x.device.type == "cpu" and x.dtype in _KERNEL_DTYPES else None
