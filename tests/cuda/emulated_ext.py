"""fw_fairseq._cuda's functions for CPU tensors, computed by csrc/cuda/'s own kernel code under a CPU
emulation of CUDA threads (emulator/cuda_emu.h), so that the kernels' indexing, masking and
control flow are tested on machines without a GPU.

The pass order of each function and its dtype contract mirror csrc/cuda/fast_weight.cpp (which needs a
GPU to run): inputs in one dtype (float16, bfloat16, float32 or float64), states in the binding's
state dtype, results in the dtypes the binding allocates. The kernels themselves run in float64
(inputs are widened exactly; emu::Scalar holds a double), so half-precision rounding inside a
kernel is not emulated, only the dtypes at the boundary. Outputs are preallocated full of NaN, so
an element no kernel writes shows up. Every buffer a kernel sees
lies between two NaN guard bands (ctypes hands the kernels raw pointers, so nothing else would
notice an overrun): a write there is reported; a read of an input in the input dtype (q, k, v,
beta, alpha, do) is reported even when the kernel discards the value; a read of an acc_t buffer (states,
vbar, du, dk_part) shows only if the NaN reaches an output. Inputs must hold no NaN.
"""
import ctypes
import math
import subprocess
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
CUDA_DIR = HERE.parents[1] / "csrc" / "cuda"
SUM, DELTA, DELTA_GRAD, GATED_DELTA, GATED_DELTA_GRAD = 0, 1, 2, 3, 4  # fw::ColMode in csrc/cuda/col_mode.h

_ptr, _int = ctypes.c_void_p, ctypes.c_int
_SIGNATURES = {
    "emu_col": [_int] + [_ptr] * 9 + [_int] * 5,
    "emu_delta_rows": [_ptr] * 14 + [_int] * 4,
    "emu_step": [_int] + [_ptr] * 7 + [_int] * 3,
    "emu_limits": [ctypes.POINTER(ctypes.c_int)] * 2,
    "emu_step_geometry": [_int] * 2 + [ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_longlong)],
}
# The harness's return codes (emulator/harness.cpp).
_ERRORS = {
    -1: "no register tier fits",
    -2: "a launch a GPU would refuse (threads per block, grid size or shared memory)",
    -3: "the step kernel wrote shared memory beyond what its launcher allocates",
    -4: "a kernel read an input element out of bounds (a NaN of the guard bands)",
}
_GUARD = 1024  # NaN elements on either side of every buffer: more than a row of any [.., E] or [.., M]


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


def _call(entry, args, outputs):
    """entry(*args) with each tensor argument (float64) copied between NaN guard bands (None stays a
    null pointer). Copies back the tensors in outputs (by identity: outputs, in-place states), checks
    that the other tensors were not written and that every guard band is intact."""
    bufs = [torch.full((a.numel() + 2 * _GUARD,), math.nan, dtype=torch.float64) if torch.is_tensor(a) else None
            for a in args]
    for a, buf in zip(args, bufs):
        if buf is not None:
            buf[_GUARD : _GUARD + a.numel()] = a.reshape(-1)
    rc = entry(*[a if buf is None else buf[_GUARD:].data_ptr() for a, buf in zip(args, bufs)])
    assert rc == 0, f"{entry.__name__}: {_ERRORS.get(rc, rc)}"
    for i, (a, buf) in enumerate(zip(args, bufs)):
        if buf is None:
            continue
        inside, guards = buf[_GUARD : _GUARD + a.numel()], torch.cat([buf[:_GUARD], buf[_GUARD + a.numel() :]])
        assert guards.isnan().all(), f"{entry.__name__}: argument {i} was written out of bounds"
        if any(a is out for out in outputs):
            a.copy_(inside.view(a.shape))
        else:  # bitwise, so that NaN inputs compare equal
            assert torch.equal(inside.view(torch.int64), a.reshape(-1).view(torch.int64)), (
                f"{entry.__name__}: input argument {i} was written")


def _nan_like(x, shape=None):
    return torch.full(x.shape if shape is None else shape, math.nan, dtype=torch.float64)


def state_dtype(dtype):
    """csrc/cuda/fast_weight.cpp's state_dtype: the states' (and the kernels' accumulation) dtype."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _widen(fn, inputs, states):
    """The binding's check_inputs on dtypes and layout ({name: tensor} of inputs in q's dtype and of
    states in the state dtype), then float64 copies of all of them for the emulator, in order."""
    dtype = inputs["q"].dtype
    assert dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64), f"{fn}: q has dtype {dtype}"
    for name, x in [*inputs.items(), *states.items()]:
        want = dtype if name in inputs else state_dtype(dtype)
        assert x.dtype == want, f"{fn}: {name} has dtype {x.dtype}, expected {want}"
        assert x.is_contiguous() and not x.is_cuda, f"{fn}: {name} must be contiguous (and here, on the CPU)"
    return dtype, [x.double() for x in [*inputs.values(), *states.values()]]


# The binding's rules (bind_rule in csrc/cuda/fast_weight.cpp): kernel name -> the per-position scalars its
# functions take after q, k, v, and the column mode of its forward.
RULES = {"sum": ((), SUM), "delta": (("beta",), DELTA), "gated_delta": (("beta", "alpha"), GATED_DELTA)}


class EmulatedExtension:
    """Same functions, signatures, dtype contract and results as fw_fairseq._cuda, for contiguous CPU tensors:
    {kernel}_forward, {kernel}_backward and {kernel}_step for each kernel of RULES, made from one forward,
    backward and step as the binding makes them."""

    def __init__(self, lib):
        self._lib = lib
        max_e, max_m = ctypes.c_int(), ctypes.c_int()
        lib.emu_limits(ctypes.byref(max_e), ctypes.byref(max_m))
        self.MAX_E, self.MAX_M = max_e.value, max_m.value  # as fw_fairseq._cuda exports them
        for kernel, (scalars, _) in RULES.items():
            self._bind(kernel, "forward", ("q", "k", "v", *scalars, "state0"))
            self._bind(kernel, "backward", ("q", "k", "v", *scalars, "state0", "do", "dfinal"))
            self._bind(kernel, "step", ("q", "k", "v", *scalars, "state"))

    def _bind(self, kernel, which, names):
        """self.{kernel}_{which}(*args): exactly the arguments `names`, positionally (else a TypeError, as the
        binding raises), handed to self._{which}(fn, kernel, {name: argument})."""
        fn, impl = f"{kernel}_{which}", getattr(self, f"_{which}")

        def call(*args):
            if len(args) != len(names):
                raise TypeError(f"{fn}() takes ({', '.join(names)}), got {len(args)} arguments")
            return impl(fn, kernel, dict(zip(names, args)))

        setattr(self, fn, call)

    def _col(self, mode, q, k, v, beta, state_in, state_out, out, aux, reverse, alpha=None):
        tensors = [q, k, v, beta, alpha, state_in, state_out, out, aux]
        for t in tensors:
            assert t is None or (t.dtype == torch.float64 and t.is_contiguous() and not t.is_cuda)
        B, H, T, P = q.shape
        _call(self._lib.emu_col, [mode, *tensors, B * H, T, P, v.shape[-1], int(reverse)], (state_out, out, aux))

    def _forward(self, fn, kernel, args):
        """The binding's forward: the rule's forward column mode, from state0."""
        scalars, mode = RULES[kernel]
        dtype, (q, k, v, *xs, state) = _widen(fn, {n: args[n] for n in ("q", "k", "v", *scalars)},
                                             dict(state=args["state0"]))
        beta, alpha = (xs + [None, None])[:2]
        o, final_state = _nan_like(v), _nan_like(state)
        self._col(mode, q, k, v, beta, state, final_state, o, None, False, alpha)
        return o.to(state_dtype(dtype)), final_state.to(state_dtype(dtype))

    def _backward(self, fn, kernel, args):
        """The binding's backward: the sum rule's three passes or the (gated) delta rule's four, gradients in
        the input dtype and dstate0 in the state dtype."""
        scalars, _ = RULES[kernel]
        dtype, (q, k, v, *xs, do, state0, dfinal) = _widen(fn, {n: args[n] for n in ("q", "k", "v", *scalars, "do")},
                                                           dict(state0=args["state0"], dfinal=args["dfinal"]))
        if kernel == "sum":
            *grads, dstate0 = self._sum_backward(q, k, v, do, state0, dfinal)
        else:
            *grads, dstate0 = self._delta_backward(q, k, v, *(xs + [None])[:2], do, state0, dfinal)
        return (*(x.to(dtype) for x in grads), dstate0.to(state_dtype(dtype)))

    def _sum_backward(self, q, k, v, do, state0, dfinal):
        """csrc/cuda/fast_weight.cpp's sum_backward in float64: [dq, dk, dv, dstate0]."""
        dq, dk, dv, dstate0 = _nan_like(q), _nan_like(k), _nan_like(v), _nan_like(state0)
        self._col(SUM, do, v, k, None, state0.transpose(-1, -2).contiguous(), None, dq, None, False)
        self._col(SUM, v, do, q, None, dfinal.transpose(-1, -2).contiguous(), None, dk, None, True)
        self._col(SUM, k, q, do, None, dfinal, dstate0, dv, None, True)
        return [dq, dk, dv, dstate0]

    def _delta_backward(self, q, k, v, beta, alpha, do, state0, dfinal):
        """csrc/cuda/fast_weight.cpp's delta_backward in float64, gated where alpha is given:
        [dq, dk, dv, dbeta, dstate0], with dalpha before dstate0 for the gated rule."""
        B, H, T, E = q.shape
        vbar, du, dk_part = _nan_like(v), _nan_like(v), _nan_like(q)
        dq, dk, dv, dbeta, dstate0 = _nan_like(q), _nan_like(k), _nan_like(v), _nan_like(beta), _nan_like(state0)
        o, final_state = (None, None) if alpha is None else (_nan_like(v), _nan_like(state0))
        self._col(DELTA if alpha is None else GATED_DELTA, q, k, v, beta, state0, final_state, o, vbar, False, alpha)
        self._col(DELTA_GRAD if alpha is None else GATED_DELTA_GRAD, q, k, do, beta, dfinal, dstate0, dv, du, True,
                  alpha)
        _call(self._lib.emu_delta_rows, [q, k, v, beta, alpha, do, vbar, du, state0, dfinal, dk_part, dq, dk, dbeta,
                                         B * H, T, E, v.shape[-1]], (dk_part, dq, dk, dbeta))
        grads = [dq, dk, dv, dbeta]
        if alpha is not None:  # the binding's gate_grad: a reverse cumulative sum (csrc/cuda/README.md)
            per_position = (o * do).sum(-1) - (dv * v).sum(-1)  # [B, H, T]
            dlog_alpha = per_position.flip(-1).cumsum(-1).flip(-1) + (dfinal * final_state).sum((-2, -1))[..., None]
            grads.append(dlog_alpha / alpha)
        return [*grads, dstate0]

    def _step(self, fn, kernel, args):
        """One step; the caller's state (in the state dtype) is updated in place, as the kernel does."""
        scalars, _ = RULES[kernel]
        state = args["state"]
        dtype, (q, k, v, *xs, state64) = _widen(fn, {n: args[n] for n in ("q", "k", "v", *scalars)},
                                               dict(state=state))
        beta, alpha = (xs + [None, None])[:2]
        B, H, T, E = q.shape
        assert T == 1
        o = _nan_like(v)
        _call(self._lib.emu_step, [int(kernel != "sum"), q, k, v, beta, alpha, state64, o, B * H, E, v.shape[-1]],
              (state64, o))
        state.copy_(state64)
        return o.to(state_dtype(dtype))

    def step_geometry(self, E, M):
        """(threads per block, dynamic shared memory bytes for a double state) of the step launcher."""
        threads, smem = ctypes.c_int(), ctypes.c_longlong()
        self._lib.emu_step_geometry(E, M, ctypes.byref(threads), ctypes.byref(smem))
        return threads.value, smem.value
