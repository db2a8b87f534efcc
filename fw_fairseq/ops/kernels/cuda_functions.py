"""The autograd wrapper around the compiled CUDA kernels in `fw_fairseq._cuda` (built from csrc/cuda/), one for
every rule: KernelFunction and cuda_causal, keyed by the rule's kernel name (UpdateRule.kernel).

The extension's functions are autograd-free; its contract (csrc/cuda/ implements it), for each kernel name
and the per-position scalars that rule reads (sum: none; delta: beta; gated_delta: beta, alpha):
    {kernel}_forward(q, k, v, *scalars, state0)                 -> (o, final_state)      state0 not modified
    {kernel}_backward(q, k, v, *scalars, state0, do, dfinal)    -> (dq, dk, dv, *dscalars, dstate0)
    {kernel}_step(q, k, v, *scalars, state) -> o                   (T = 1, state updated in place)
    MAX_E, MAX_M: the largest E and M the kernels accept
Inputs are contiguous CUDA tensors: q, k [B, H, T, E], v [B, H, T, M], the scalars [B, H, T] and do in one
dtype (fp16/bf16/fp32), state [B, H, E, M] in guards.state_dtype of it (float32 for fp16/bf16).
Outputs o and states come back in the state dtype, as on the chunked path; the gradients of q, k, v
and the scalars in the input dtype. The output's gradient is rounded to the input dtype for the backward
kernels, which read it where they read q, k or v.
Which calls land here is decided only by cuda_extension.cuda_kernel; this file does not choose.
"""
import torch

from fw_fairseq.ops.common.guards import first_order


class KernelFunction(torch.autograd.Function):
    """(ext, kernel, q, k, v, *scalars, state0) -> (o [B, H, T, M], final_state [B, H, E, M]) through the
    extension's {kernel}_forward and {kernel}_backward. The backward re-runs the kernel's own recomputation
    from state0, so only the inputs are saved."""

    @staticmethod
    def forward(ctx, ext, kernel, *inputs):
        o, final_state = getattr(ext, f"{kernel}_forward")(*inputs)
        ctx.ext, ctx.kernel = ext, kernel
        ctx.save_for_backward(*inputs)
        return o, final_state

    @staticmethod
    @first_order  # the kernels' backward is not differentiable: double backward fails loudly
    def backward(ctx, do, dfinal):
        # autograd materialises an unused output's gradient as zeros, so neither is None here
        inputs = ctx.saved_tensors  # q, k, v, *scalars, state0
        do = do.to(inputs[0].dtype).contiguous()  # o is in the state dtype, the kernels read do in q's
        grads = getattr(ctx.ext, f"{ctx.kernel}_backward")(*inputs, do, dfinal.contiguous())
        return (None, None, *grads)  # nothing for the extension and the kernel name


def cuda_causal(ext, kernel, *inputs):
    """(o, final state) of the rule whose kernel is named `kernel`, inputs = (q, k, v, *scalars, state0) in
    the ops' order. A single step without autograd runs the in-place step kernel on a copy of state0 (the
    caller's state is never modified); everything else runs KernelFunction."""
    q, state0 = inputs[0], inputs[-1]
    if q.shape[2] == 1 and not (torch.is_grad_enabled() and any(x.requires_grad for x in inputs)):
        state = state0.clone()
        return getattr(ext, f"{kernel}_step")(*inputs[:-1], state), state
    return KernelFunction.apply(ext, kernel, *inputs)
