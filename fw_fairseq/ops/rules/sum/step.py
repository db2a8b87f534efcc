"""The sum rule's T = 1 forms (a decoding step): one outer-product update and one read, without the chunk
machinery's small-op overhead. Same function as the chunked form at T = 1 (tests/ops/test_ops_step.py checks it
against the naive loop, outputs, states and gradients).

q, k [B, H, 1, E]; v [B, H, 1, M]; state [B, H, E, M] or None (zero). Computed and returned in
guards.state_dtype (float32 for fp16/bf16 inputs).
"""
import torch

from fw_fairseq.ops.common.guards import state_dtype
from fw_fairseq.ops.common.outer import add_outer, add_outer_, cast
from fw_fairseq.ops.kernels.cpu_extension import cpu_kernel


def step_sum(q, k, v, initial_state=None, output_final_state=False):
    """S + k^T v, o = q S."""
    q, k, v, S0 = cast(state_dtype(q.dtype), initial_state, q, k, v)
    S = add_outer(S0, k, v)  # [B, H, E, M]
    return q @ S, (S if output_final_state else None)


def in_place_step_sum(q, k, v, state, order=None, out=None):
    """Generation's step of the sum rule's state (no autograd through it; the z column rides in v): the hypotheses
    continue the rows `order` [B] of state [B', H, E, M] (beam search's reorder; None: all rows, in order), and their
    new state goes into `out` [B, H, E, M] (None: state itself, updated in place). o = q S + (q . k) v, S += k^T v.
    Returns o [B, H, 1, M]. On the CPU kernel (csrc/cpu/state_step.cpp), which reads each state once for q and writes it
    once, where it is built; the PyTorch form gathers, then steps in place (rules/delta/step.py says why)."""
    out = state if out is None else out
    kernel = cpu_kernel(state)
    if kernel and state.is_contiguous() and out.is_contiguous():
        return kernel.state_step(q, k, v, None, None, state, order, out)
    if order is not None:
        torch.index_select(state, 0, order, out=out)
    q, k, v = (x.to(out.dtype) for x in (q, k, v))
    o = q @ out + (q * k).sum(-1, keepdim=True) * v  # q (S + k^T v): [B, H, 1, M]
    add_outer_(out, k, v)
    return o
