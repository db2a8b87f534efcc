"""The compiled CPU extension fw_fairseq._cpu (setup.py builds cpu/*.cpp into it, wherever a C++ compiler
was there at install time), for the ops that have a kernel there: DPFP's forward and backward and its
scores from raw keys (dpfp_function.py), a short sequence's read from raw heads (feature_attend.py), a decoding step
of the state (step.py). Each op also has a
PyTorch form, the same function, which runs where the extension was not built or does not take the
tensors (not on the CPU, or neither float32 nor float64).
"""
import torch

_KERNEL_DTYPES = (torch.float32, torch.float64)
KERNEL_NORMS = {None: 0, "sum": 1, "l2": 2}  # the normalisations of phi as the kernels take them (fw::Norm)
KERNEL_MAPS = {"dpfp": 0, "elu": 1, "hedgehog": 2, "favor": 3}  # the maps with a row form there (fw::Map, map_rows.h)
_cpu = None  # fw_fairseq._cpu once imported, False where it is not built


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
