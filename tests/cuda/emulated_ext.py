"""fw_fairseq._cuda's functions for CPU float64 tensors, computed by cuda/'s own kernel code under a
CPU emulation of CUDA threads (emulator/cuda_emu.h), so that the kernels' indexing, masking and
control flow are tested on machines without a GPU.

The pass order of each function mirrors cuda/fast_weight.cpp (which needs a GPU to run); outputs
are preallocated full of NaN, so an element no kernel writes shows up.
"""
import ctypes
import math
import subprocess
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CUDA_DIR = HERE.parents[1] / "cuda"
SUM, DELTA, DELTA_GRAD = 0, 1, 2  # fw::ColMode in cuda/col_mode.h

_ptr, _int = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "emu_col": [_int] + [_ptr] * 8 + [_int] * 5,
    "emu_delta_rows": [_ptr] * 13 + [_int] * 4,
    "emu_step": [_int] + [_ptr] * 6 + [_int] * 3,
}


def build(out_dir):
    """Compiles emulator/harness.cpp with the kernel headers into out_dir; returns the extension."""
    so = Path(out_dir) / "fw_cuda_emulated.so"
    cmd = ["g++", "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", f"-I{CUDA_DIR}",
           str(HERE / "emulator" / "harness.cpp"), "-o", str(so)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    lib = ctypes.CDLL(str(so))
    for name, argtypes in _SIGNATURES.items():
        getattr(lib, name).argtypes = argtypes
    return EmulatedExtension(lib)


def _p(t):
    return None if t is None else t.data_ptr()


def _nan_like(x, shape=None):
    return torch.full(x.shape if shape is None else shape, math.nan, dtype=torch.float64)


class EmulatedExtension:
    """Same signatures and results as fw_fairseq._cuda, for contiguous float64 CPU tensors."""

    def __init__(self, lib):
        self._lib = lib

    def _col(self, mode, q, k, v, beta, state_in, state_out, out, aux, reverse):
        tensors = [q, k, v, beta, state_in, state_out, out, aux]
        for t in tensors:
            assert t is None or (t.dtype == torch.float64 and t.is_contiguous() and not t.is_cuda)
        B, H, T, P = q.shape
        rc = self._lib.emu_col(mode, *map(_p, tensors), B * H, T, P, v.shape[-1], int(reverse))
        assert rc == 0, "no register tier fits"

    def sum_forward(self, q, k, v, state):
        o, final_state = _nan_like(v), _nan_like(state)
        self._col(SUM, q, k, v, None, state, final_state, o, None, False)
        return o, final_state

    def sum_backward(self, q, k, v, state0, do, dfinal):
        dq, dk, dv, dstate0 = _nan_like(q), _nan_like(k), _nan_like(v), _nan_like(state0)
        self._col(SUM, do, v, k, None, state0.transpose(-1, -2).contiguous(), None, dq, None, False)
        self._col(SUM, v, do, q, None, dfinal.transpose(-1, -2).contiguous(), None, dk, None, True)
        self._col(SUM, k, q, do, None, dfinal, dstate0, dv, None, True)
        return dq, dk, dv, dstate0

    def delta_forward(self, q, k, v, beta, state):
        o, final_state = _nan_like(v), _nan_like(state)
        self._col(DELTA, q, k, v, beta, state, final_state, o, None, False)
        return o, final_state

    def delta_backward(self, q, k, v, beta, state0, do, dfinal):
        B, H, T, E = q.shape
        vbar, du, dk_part = _nan_like(v), _nan_like(v), _nan_like(q)
        dq, dk, dv, dbeta, dstate0 = _nan_like(q), _nan_like(k), _nan_like(v), _nan_like(beta), _nan_like(state0)
        self._col(DELTA, q, k, v, beta, state0, None, None, vbar, False)
        self._col(DELTA_GRAD, q, k, do, beta, dfinal, dstate0, dv, du, True)
        rc = self._lib.emu_delta_rows(*map(_p, (q, k, v, beta, do, vbar, du, state0, dfinal, dk_part, dq, dk, dbeta)),
                                      B * H, T, E, v.shape[-1])
        assert rc == 0, "no register tier fits"
        return dq, dk, dv, dbeta, dstate0

    def _step(self, delta, q, k, v, beta, state):
        B, H, T, E = q.shape
        assert T == 1
        o = _nan_like(v)
        self._lib.emu_step(int(delta), *map(_p, (q, k, v, beta, state, o)), B * H, E, v.shape[-1])
        return o

    def sum_step(self, q, k, v, state):
        return self._step(False, q, k, v, None, state)

    def delta_step(self, q, k, v, beta, state):
        return self._step(True, q, k, v, beta, state)
