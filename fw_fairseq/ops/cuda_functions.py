"""autograd wrappers around the compiled CUDA kernels in `fw_fairseq._cuda` (built from cuda/).

The extension's functions are autograd-free; its contract (cuda/ implements it):
    sum_forward(q, k, v, state0)                       -> (o, final_state)      state0 not modified
    sum_backward(q, k, v, state0, do, dfinal)          -> (dq, dk, dv, dstate0)
    delta_forward(q, k, v, beta, state0)               -> (o, final_state)      state0 not modified
    delta_backward(q, k, v, beta, state0, do, dfinal)  -> (dq, dk, dv, dbeta, dstate0)
    gated_delta_forward(q, k, v, beta, alpha, state0)  -> (o, final_state)
    gated_delta_backward(q, k, v, beta, alpha, state0, do, dfinal) -> (dq, dk, dv, dbeta, dalpha, dstate0)
    sum_step(q, k, v, state) -> o;  delta_step(q, k, v, beta, state) -> o;
    gated_delta_step(q, k, v, beta, alpha, state) -> o                        (T = 1, state updated in place)
    MAX_E, MAX_M: the largest E and M the kernels accept
Inputs are contiguous CUDA tensors: q, k [B, H, T, E], v [B, H, T, M], beta, alpha [B, H, T] and do in one
dtype (fp16/bf16/fp32), state [B, H, E, M] in guards.state_dtype of it (float32 for fp16/bf16).
Outputs o and states come back in the state dtype, as on the chunked path; the gradients of q, k, v
and beta in the input dtype. The output's gradient is rounded to the input dtype for the backward
kernels, which read it where they read q, k or v.
Which calls land here is decided only by cuda_extension.cuda_kernel; this file does not choose.
"""
import torch

from .guards import first_order


class SumFunction(torch.autograd.Function):
    """(q, k, v, state0) -> (o [B, H, T, M], final_state [B, H, E, M]); the backward re-runs the
    kernel's own recomputation from state0, so only the inputs are saved."""

    @staticmethod
    def forward(ctx, ext, q, k, v, state0):
        o, final_state = ext.sum_forward(q, k, v, state0)
        ctx.ext = ext
        ctx.save_for_backward(q, k, v, state0)
        return o, final_state

    @staticmethod
    @first_order  # the kernels' backward is not differentiable: double backward fails loudly
    def backward(ctx, do, dfinal):
        # autograd materialises an unused output's gradient as zeros, so neither is None here
        q, k, v, state0 = ctx.saved_tensors
        do = do.to(q.dtype).contiguous()  # o is in the state dtype, the kernels read do in q's
        dq, dk, dv, dstate0 = ctx.ext.sum_backward(q, k, v, state0, do, dfinal.contiguous())
        return None, dq, dk, dv, dstate0


class DeltaFunction(torch.autograd.Function):
    """(q, k, v, beta, state0) -> (o [B, H, T, M], final_state [B, H, E, M])."""

    @staticmethod
    def forward(ctx, ext, q, k, v, beta, state0):
        o, final_state = ext.delta_forward(q, k, v, beta, state0)
        ctx.ext = ext
        ctx.save_for_backward(q, k, v, beta, state0)
        return o, final_state

    @staticmethod
    @first_order
    def backward(ctx, do, dfinal):
        q, k, v, beta, state0 = ctx.saved_tensors
        grads = ctx.ext.delta_backward(q, k, v, beta, state0, do.to(q.dtype).contiguous(), dfinal.contiguous())
        return (None, *grads)


class GatedDeltaFunction(torch.autograd.Function):
    """(q, k, v, beta, alpha, state0) -> (o [B, H, T, M], final_state [B, H, E, M])."""

    @staticmethod
    def forward(ctx, ext, q, k, v, beta, alpha, state0):
        o, final_state = ext.gated_delta_forward(q, k, v, beta, alpha, state0)
        ctx.ext = ext
        ctx.save_for_backward(q, k, v, beta, alpha, state0)
        return o, final_state

    @staticmethod
    @first_order
    def backward(ctx, do, dfinal):
        q, k, v, beta, alpha, state0 = ctx.saved_tensors
        grads = ctx.ext.gated_delta_backward(q, k, v, beta, alpha, state0, do.to(q.dtype).contiguous(),
                                             dfinal.contiguous())
        return (None, *grads)


def cuda_sum(ext, q, k, v, state0):
    """Sum rule through the kernel; a single step without autograd uses the in-place step kernel
    on a copy of state0 (the caller's state is never modified)."""
    if q.shape[2] == 1 and not (torch.is_grad_enabled() and _any_requires_grad(q, k, v, state0)):
        state = state0.clone()
        return ext.sum_step(q, k, v, state), state
    return SumFunction.apply(ext, q, k, v, state0)


def cuda_delta(ext, q, k, v, beta, state0):
    """Delta rule through the kernel (see cuda_sum for the single-step case)."""
    if q.shape[2] == 1 and not (torch.is_grad_enabled() and _any_requires_grad(q, k, v, beta, state0)):
        state = state0.clone()
        return ext.delta_step(q, k, v, beta, state), state
    return DeltaFunction.apply(ext, q, k, v, beta, state0)


def cuda_gated_delta(ext, q, k, v, beta, alpha, state0):
    """Gated delta rule through the kernel (see cuda_sum for the single-step case)."""
    if q.shape[2] == 1 and not (torch.is_grad_enabled() and _any_requires_grad(q, k, v, beta, alpha, state0)):
        state = state0.clone()
        return ext.gated_delta_step(q, k, v, beta, alpha, state), state
    return GatedDeltaFunction.apply(ext, q, k, v, beta, alpha, state0)


def _any_requires_grad(*tensors):
    return any(t.requires_grad for t in tensors)
