"""The fast weight ops' autograd Functions as torch.library custom ops, for torch.compile only.

torch.compile cannot see through what the ops run outside plain tensor code: the CUDA kernels
(fw_fairseq._cuda) are opaque to it, and tracing the chunked Functions' hand-written backward
passes fails (their loops write in place into strided slices with out=) or graph-breaks. So while
torch.compile traces (`torch.compiler.is_compiling()`), chunked.py and fast_weight.py call the custom
ops below instead; eager calls run the Functions as before and pay only that check. Around the ops,
the public ops' validation, dtype rule, chunking and reshapes are plain tensor code that torch.compile
traces, so their errors are raised while tracing, as in eager.

Each op runs a Function's own forward and backward (ChunkedSum, ChunkedDelta, the CUDA wrappers):
the same maths, no second copy. A forward op returns the Function's outputs and the tensors its
forward saves for backward (the custom-op form of ctx.save_for_backward: an op's results are its only
way out); register_autograd hands them to the backward op. Fake (meta) implementations: the chunked
ops run the same code on fake tensors (the shapes of what is saved follow from it); the kernel ops
give the binding's shapes (cuda_functions.py's docstring).
Custom ops return no None: results that are None in a call (no final state asked for, no per-chunk
states with one chunk and no initial state, ...) are left out, and `_sum_slots` / `_delta_slots` say,
from the arguments, which are there.
"""
from typing import List, Optional

import torch
from torch import Tensor

from . import cuda_extension  # the kernel ops find the extension where the dispatch does
from .chunked_delta_function import ChunkedDelta
from .chunked_sum_function import ChunkedSum
from .cuda_functions import DeltaFunction, GatedDeltaFunction, SumFunction, cuda_delta, cuda_gated_delta, cuda_sum

_KERNELS = {"sum": (cuda_sum, SumFunction), "delta": (cuda_delta, DeltaFunction),
            "gated_delta": (cuda_gated_delta, GatedDeltaFunction)}  # UpdateRule.kernel -> wrapper, Function


class _Context:
    """A Function's ctx outside autograd: keeps what its forward saves and hands it to its backward."""

    def __init__(self, saved=(), **attributes):
        self.saved_tensors = saved
        self.__dict__.update(attributes)

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def set_materialize_grads(self, value):
        """The custom ops' autograd decides this (setup_context)."""


def _custom_op(name, function):
    """fw_fairseq::name running `function`, whose fake implementation is `function` itself on fake tensors."""
    op = torch.library.custom_op(f"fw_fairseq::{name}", function, mutates_args=())
    op.register_fake(function)
    return op


def _present(tensors):
    return [x for x in tensors if x is not None]


def _unpack(results, there):
    """The op's list back to its slots: `there` says, slot by slot, whether it holds a tensor."""
    results = iter(results)
    return [next(results) if present else None for present in there]


# ------------------------------------------------------------------------------- chunked sum rule

def _chunked_sum(Q: Tensor, K: Tensor, V: Tensor, S0: Optional[Tensor], need_final: bool,
                 save: bool) -> List[Tensor]:
    """[o, final state if need_final, P, per-chunk states if any (when save)]."""
    ctx = _Context()
    o, S = ChunkedSum.forward(ctx, Q, K, V, S0, need_final, save)
    return _present([o, S, *ctx.saved_tensors[3:]])  # saved: Q, K, V (the inputs), P, states


_chunked_sum_op = _custom_op("chunked_sum", _chunked_sum)


def _sum_slots(K, S0, need_final):
    """Which of [o, S, P, states] the forward op returns (states: None with one chunk and no S0)."""
    return [True, need_final, True, S0 is not None or K.shape[1] > 1]


def _chunked_sum_backward(Q: Tensor, K: Tensor, V: Tensor, S0: Optional[Tensor], P: Tensor,
                          states: Optional[Tensor], dO: Optional[Tensor], dS: Optional[Tensor]) -> List[Tensor]:
    """[dQ, dK, dV, dS0 if S0 is given]."""
    ctx = _Context((Q, K, V, P, states), has_S0=S0 is not None)
    return _present(ChunkedSum.backward(ctx, dO, dS)[:4])


_custom_op("chunked_sum_backward", _chunked_sum_backward)


def _chunked_sum_setup(ctx, inputs, output):
    Q, K, V, S0, need_final, save = inputs
    _, _, P, states = _unpack(output, _sum_slots(K, S0, need_final))
    ctx.save_for_backward(Q, K, V, S0, P, states)
    ctx.need_final = need_final


def _chunked_sum_grad(ctx, grads):
    Q, K, V, S0, P, states = ctx.saved_tensors
    dS = grads[1] if ctx.need_final else None
    dQ, dK, dV, dS0 = _unpack(torch.ops.fw_fairseq.chunked_sum_backward(Q, K, V, S0, P, states, grads[0], dS),
                              [True, True, True, S0 is not None])
    return dQ, dK, dV, dS0, None, None


_chunked_sum_op.register_autograd(_chunked_sum_grad, setup_context=_chunked_sum_setup)


# ------------------------------------------------------------------- chunked (gated) delta rule

def _chunked_delta(Q: Optional[Tensor], K: Tensor, V: Tensor, beta: Tensor, g: Optional[Tensor],
                   S0: Optional[Tensor], need_final: bool, save: bool) -> List[Tensor]:
    """[o if Q is given, final state if need_final, X, T, u, r, P if Q is given, per-chunk states if
    any (the last six when save)]."""
    ctx = _Context()
    o, S = ChunkedDelta.forward(ctx, Q, K, V, beta, g, S0, need_final, save)
    saved = list(ctx.saved_tensors[4:])  # saved: Q, K, beta, g (the inputs), X, T, u, r, P, states
    if saved and S0 is None and K.shape[1] == 1:
        saved[3] = saved[3].clone()  # one chunk from a zero state: r = V - K S is V itself, which no op may return
    return _present([o, S, *saved])


_chunked_delta_op = _custom_op("chunked_delta", _chunked_delta)


def _delta_slots(Q, K, S0, need_final):
    """Which of [o, S, X, T, u, r, P, states] the forward op returns."""
    return [Q is not None, need_final, True, True, True, True, Q is not None, S0 is not None or K.shape[1] > 1]


def _chunked_delta_backward(Q: Optional[Tensor], K: Tensor, beta: Tensor, g: Optional[Tensor],
                            S0: Optional[Tensor], X: Tensor, T: Tensor, u: Tensor, r: Tensor, P: Optional[Tensor],
                            states: Optional[Tensor], dO: Optional[Tensor], dS: Optional[Tensor]) -> List[Tensor]:
    """[dQ if Q is given, dK, dV, dbeta, dg if g is given, dS0 if S0 is given]."""
    ctx = _Context((Q, K, beta, g, X, T, u, r, P, states), has_S0=S0 is not None)
    dQ, dK, dV, dbeta, dg, dS0 = ChunkedDelta.backward(ctx, dO, dS)[:6]
    if Q is not None and dQ is None:  # no output gradient: the Function leaves dQ None, an op returns a tensor
        dQ = torch.zeros_like(Q)
    return _present([dQ, dK, dV, dbeta, dg, dS0])


_custom_op("chunked_delta_backward", _chunked_delta_backward)


def _chunked_delta_setup(ctx, inputs, output):
    Q, K, V, beta, g, S0, need_final, save = inputs
    _, _, X, T, u, r, P, states = _unpack(output, _delta_slots(Q, K, S0, need_final))
    ctx.save_for_backward(Q, K, beta, g, S0, X, T, u, r, P, states)
    ctx.need_final, ctx.has_Q = need_final, Q is not None


def _chunked_delta_grad(ctx, grads):
    Q, K, beta, g, S0, X, T, u, r, P, states = ctx.saved_tensors
    dO, dS = _unpack(grads[:ctx.has_Q + ctx.need_final], [ctx.has_Q, ctx.need_final])
    results = torch.ops.fw_fairseq.chunked_delta_backward(Q, K, beta, g, S0, X, T, u, r, P, states, dO, dS)
    dQ, dK, dV, dbeta, dg, dS0 = _unpack(results, [Q is not None, True, True, True, g is not None, S0 is not None])
    return dQ, dK, dV, dbeta, dg, dS0, None, None


_chunked_delta_op.register_autograd(_chunked_delta_grad, setup_context=_chunked_delta_setup)


def apply_chunked_sum(Q, K, V, S0, need_final, save):
    """ChunkedSum.apply in eager, its custom op while torch.compile traces: (o, final state or None)."""
    if not torch.compiler.is_compiling():
        return ChunkedSum.apply(Q, K, V, S0, need_final, save)
    results = torch.ops.fw_fairseq.chunked_sum(Q, K, V, S0, need_final, save)
    o, S = _unpack(results, _sum_slots(K, S0, need_final))[:2]
    return o, S


def apply_chunked_delta(Q, K, V, beta, g, S0, need_final, save):
    """ChunkedDelta.apply in eager, its custom op while torch.compile traces: (o or None, final state or None)."""
    if not torch.compiler.is_compiling():
        return ChunkedDelta.apply(Q, K, V, beta, g, S0, need_final, save)
    results = torch.ops.fw_fairseq.chunked_delta(Q, K, V, beta, g, S0, need_final, save)
    o, S = _unpack(results, _delta_slots(Q, K, S0, need_final))[:2]
    return o, S


# --------------------------------------------------------------------------- CUDA kernels

def _kernel(kernel: str, inputs: List[Tensor], state0: Tensor) -> List[Tensor]:
    """[o, final state] of the rule whose UpdateRule.kernel is `kernel`, inputs = [q, k, v, *scalars]:
    its CUDA wrapper without autograd (the step kernel for T = 1; the backward op differentiates)."""
    wrapper = _KERNELS[kernel][0]
    with torch.no_grad():
        return list(wrapper(cuda_extension.cuda_kernel(inputs[0], inputs[2], kernel), *inputs, state0))


def _kernel_fake(kernel, inputs, state0):
    q, v = inputs[0], inputs[2]
    return [q.new_empty(*q.shape[:3], v.shape[-1], dtype=state0.dtype), torch.empty_like(state0)]  # o [B, H, T, M]


def _kernel_backward(kernel: str, inputs: List[Tensor], state0: Tensor, do: Tensor, dfinal: Tensor) -> List[Tensor]:
    """The gradients of [*inputs, state0]: the rule's CUDA Function's backward."""
    ctx = _Context((*inputs, state0), ext=cuda_extension.cuda_kernel(inputs[0], inputs[2], kernel))
    return list(_KERNELS[kernel][1].backward(ctx, do, dfinal)[1:])  # [0]: the extension's (None)


def _kernel_backward_fake(kernel, inputs, state0, do, dfinal):
    return [torch.empty_like(x) for x in (*inputs, state0)]  # each gradient in its input's dtype


def _kernel_setup(ctx, inputs, output):
    kernel, tensors, state0 = inputs
    ctx.save_for_backward(*tensors, state0)
    ctx.kernel = kernel


def _kernel_grad(ctx, grads):
    *tensors, state0 = ctx.saved_tensors
    *dtensors, dstate0 = torch.ops.fw_fairseq.kernel_backward(ctx.kernel, tensors, state0, *grads)
    return None, dtensors, dstate0


_kernel_op = torch.library.custom_op("fw_fairseq::kernel", _kernel, mutates_args=())
_kernel_op.register_fake(_kernel_fake)
_kernel_op.register_autograd(_kernel_grad, setup_context=_kernel_setup)
torch.library.custom_op("fw_fairseq::kernel_backward", _kernel_backward, mutates_args=()).register_fake(
    _kernel_backward_fake)


def apply_kernel(rule, ext, *tensors):
    """rule.cuda(ext, q, k, v, *scalars, state0) in eager, its custom op while torch.compile traces:
    (o, final state)."""
    if not torch.compiler.is_compiling():
        return rule.cuda(ext, *tensors)
    o, S = torch.ops.fw_fairseq.kernel(rule.kernel, list(tensors[:-1]), tensors[-1])
    return o, S
