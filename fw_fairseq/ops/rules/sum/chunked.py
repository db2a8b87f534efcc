"""The sum rule's chunked form: chunkwise parallel over chunks (ChunkedSum, chunked_function.py), and its
torch.library custom op, which the form calls while torch.compile traces (tracing the Function's hand-written
backward fails: its loops write in place into strided slices with out=). The op runs the Function's own forward
and backward and returns what the forward saves (the custom-op form of ctx.save_for_backward); results that are
None in a call are left out, and `_sum_slots` says from the arguments which are there.

Shapes: q, k [B, H, T, E]; v [B, H, T, M]; state [B, H, E, M]. fp16/bf16 inputs are computed in float32
(guards.state_dtype).
"""
from typing import List, Optional

import torch
from torch import Tensor

from fw_fairseq.ops.common.chunking import (SUM_CHUNK_SIZE, balanced_chunk, from_head_major, head_major_chunks,
                                            heads_state, unflatten_state)
from fw_fairseq.ops.common.custom_op import Context, custom_op, present, unpack
from fw_fairseq.ops.common.guards import records, state_dtype
from fw_fairseq.ops.rules.sum.chunked_function import ChunkedSum


def _chunked_sum(Q: Tensor, K: Tensor, V: Tensor, S0: Optional[Tensor], need_final: bool,
                 save: bool) -> List[Tensor]:
    """[o, final state if need_final, P, per-chunk states if any (when save)]."""
    ctx = Context()
    o, S = ChunkedSum.forward(ctx, Q, K, V, S0, need_final, save)
    return present([o, S, *ctx.saved_tensors[3:]])  # saved: Q, K, V (the inputs), P, states


_chunked_sum_op = custom_op("chunked_sum", _chunked_sum)


def _sum_slots(K, S0, need_final):
    """Which of [o, S, P, states] the forward op returns (states: None with one chunk and no S0)."""
    return [True, need_final, True, S0 is not None or K.shape[1] > 1]


def _chunked_sum_backward(Q: Tensor, K: Tensor, V: Tensor, S0: Optional[Tensor], P: Tensor,
                          states: Optional[Tensor], dO: Optional[Tensor], dS: Optional[Tensor]) -> List[Tensor]:
    """[dQ, dK, dV, dS0 if S0 is given]."""
    ctx = Context((Q, K, V, P, states), has_S0=S0 is not None)
    return present(ChunkedSum.backward(ctx, dO, dS)[:4])


custom_op("chunked_sum_backward", _chunked_sum_backward)


def _chunked_sum_setup(ctx, inputs, output):
    Q, K, V, S0, need_final, save = inputs
    _, _, P, states = unpack(output, _sum_slots(K, S0, need_final))
    ctx.save_for_backward(Q, K, V, S0, P, states)
    ctx.need_final = need_final


def _chunked_sum_grad(ctx, grads):
    Q, K, V, S0, P, states = ctx.saved_tensors
    dS = grads[1] if ctx.need_final else None
    dQ, dK, dV, dS0 = unpack(torch.ops.fw_fairseq.chunked_sum_backward(Q, K, V, S0, P, states, grads[0], dS),
                              [True, True, True, S0 is not None])
    return dQ, dK, dV, dS0, None, None


_chunked_sum_op.register_autograd(_chunked_sum_grad, setup_context=_chunked_sum_setup)


def apply_chunked_sum(Q, K, V, S0, need_final, save):
    """ChunkedSum.apply in eager, its custom op while torch.compile traces: (o, final state or None)."""
    if not torch.compiler.is_compiling():
        return ChunkedSum.apply(Q, K, V, S0, need_final, save)
    results = torch.ops.fw_fairseq.chunked_sum(Q, K, V, S0, need_final, save)
    o, S = unpack(results, _sum_slots(K, S0, need_final))[:2]
    return o, S


def chunked_sum(q, k, v, initial_state=None, output_final_state=False, chunk_size=SUM_CHUNK_SIZE):
    """Causal sum rule, parallel over chunks (ChunkedSum). Returns (o [B, H, T, M], state or None).

    o_chunk = Q S_before + tril(Q K^T) V, where S_before is the exclusive prefix sum of K_n^T V_n.
    """
    B, H, T, _ = q.shape
    dtype = state_dtype(q.dtype)
    C = balanced_chunk(T, chunk_size)
    Q, K, V = (head_major_chunks(x, C, dtype) for x in (q, k, v))  # [BH, N, C, E|M]
    S0 = heads_state(initial_state, dtype)
    o, S = apply_chunked_sum(Q, K, V, S0, output_final_state, records(Q, K, V, S0))
    return from_head_major(o, B, H, T), unflatten_state(S, B, H)  # o [B, H, T, M]
