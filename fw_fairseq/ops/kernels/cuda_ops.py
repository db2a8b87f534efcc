"""The CUDA kernels' autograd wrapper as a torch.library custom op, for torch.compile only: the kernels
(fw_fairseq._cuda) are opaque to it. While torch.compile traces, the dispatch calls the op below; eager calls
run the wrapper (cuda_functions.py) and pay only that check. The op runs the wrapper's own forward and backward,
for any rule by its kernel name (UpdateRule.kernel); its fake implementation gives the binding's shapes
(cuda_functions.py's docstring).
"""
from typing import List

import torch
from torch import Tensor

from fw_fairseq.ops.common.custom_op import Context
from fw_fairseq.ops.kernels import cuda_extension  # the kernel op finds the extension where the dispatch does
from fw_fairseq.ops.kernels.cuda_functions import KernelFunction, cuda_causal


def _kernel(kernel: str, inputs: List[Tensor], state0: Tensor) -> List[Tensor]:
    """[o, final state] of the rule whose UpdateRule.kernel is `kernel`, inputs = [q, k, v, *scalars]:
    cuda_causal without autograd (the step kernel for T = 1; the backward op differentiates)."""
    with torch.no_grad():
        return list(cuda_causal(cuda_extension.cuda_kernel(inputs[0], inputs[2], kernel), kernel, *inputs, state0))


def _kernel_fake(kernel, inputs, state0):
    q, v = inputs[0], inputs[2]
    return [q.new_empty(*q.shape[:3], v.shape[-1], dtype=state0.dtype), torch.empty_like(state0)]  # o [B, H, T, M]


def _kernel_backward(kernel: str, inputs: List[Tensor], state0: Tensor, do: Tensor, dfinal: Tensor) -> List[Tensor]:
    """The gradients of [*inputs, state0]: KernelFunction's backward."""
    ctx = Context((*inputs, state0), ext=cuda_extension.cuda_kernel(inputs[0], inputs[2], kernel), kernel=kernel)
    return list(KernelFunction.backward(ctx, do, dfinal)[2:])  # [:2]: the extension's and the kernel name's (None)


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
    """cuda_causal(ext, rule.kernel, q, k, v, *scalars, state0) in eager, its custom op while torch.compile
    traces: (o, final state)."""
    if not torch.compiler.is_compiling():
        return cuda_causal(ext, rule.kernel, *tensors)
    o, S = torch.ops.fw_fairseq.kernel(rule.kernel, list(tensors[:-1]), tensors[-1])
    return o, S
