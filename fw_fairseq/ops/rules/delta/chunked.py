"""The delta rules' chunked form: the chunkwise WY/UT form (ChunkedDelta, chunked_function.py; the ungated
rule is the gated one with alpha = 1, which skips every decay), and its torch.library custom op, which the form
calls while torch.compile traces (as rules/sum/chunked.py). Results that are None in a call are left out of the
op's list, and `_delta_slots` says from the arguments which are there.

Shapes: q, k [B, H, T, E]; v [B, H, T, M]; beta, alpha [B, H, T]; state [B, H, E, M]. fp16/bf16 inputs are
computed in float32 (guards.state_dtype).
"""
from typing import List, Optional

import torch
from torch import Tensor

from fw_fairseq.ops.common.chunking import (DELTA_CHUNK_SIZE, DELTA_ONE_CHUNK_MAX, balanced_chunk, from_head_major,
                                            head_major_chunks, heads_state, unflatten_state)
from fw_fairseq.ops.common.custom_op import Context, custom_op, present, unpack
from fw_fairseq.ops.common.guards import records, state_dtype
from fw_fairseq.ops.rules.delta.chunked_function import ChunkedDelta


def _chunked_delta(Q: Optional[Tensor], K: Tensor, V: Tensor, beta: Tensor, g: Optional[Tensor],
                   S0: Optional[Tensor], need_final: bool, save: bool) -> List[Tensor]:
    """[o if Q is given, final state if need_final, X, T, u, r, P if Q is given, per-chunk states if
    any (the last six when save)]."""
    ctx = Context()
    o, S = ChunkedDelta.forward(ctx, Q, K, V, beta, g, S0, need_final, save)
    saved = list(ctx.saved_tensors[4:])  # saved: Q, K, beta, g (the inputs), X, T, u, r, P, states
    if saved and S0 is None and K.shape[1] == 1:
        saved[3] = saved[3].clone()  # one chunk from a zero state: r = V - K S is V itself, which no op may return
    return present([o, S, *saved])


_chunked_delta_op = custom_op("chunked_delta", _chunked_delta)


def _delta_slots(Q, K, S0, need_final):
    """Which of [o, S, X, T, u, r, P, states] the forward op returns."""
    return [Q is not None, need_final, True, True, True, True, Q is not None, S0 is not None or K.shape[1] > 1]


def _chunked_delta_backward(Q: Optional[Tensor], K: Tensor, beta: Tensor, g: Optional[Tensor],
                            S0: Optional[Tensor], X: Tensor, T: Tensor, u: Tensor, r: Tensor, P: Optional[Tensor],
                            states: Optional[Tensor], dO: Optional[Tensor], dS: Optional[Tensor]) -> List[Tensor]:
    """[dQ if Q is given, dK, dV, dbeta, dg if g is given, dS0 if S0 is given]."""
    ctx = Context((Q, K, beta, g, X, T, u, r, P, states), has_S0=S0 is not None)
    dQ, dK, dV, dbeta, dg, dS0 = ChunkedDelta.backward(ctx, dO, dS)[:6]
    if Q is not None and dQ is None:  # no output gradient: the Function leaves dQ None, an op returns a tensor
        dQ = torch.zeros_like(Q)
    return present([dQ, dK, dV, dbeta, dg, dS0])


custom_op("chunked_delta_backward", _chunked_delta_backward)


def _chunked_delta_setup(ctx, inputs, output):
    Q, K, V, beta, g, S0, need_final, save = inputs
    _, _, X, T, u, r, P, states = unpack(output, _delta_slots(Q, K, S0, need_final))
    ctx.save_for_backward(Q, K, beta, g, S0, X, T, u, r, P, states)
    ctx.need_final, ctx.has_Q = need_final, Q is not None


def _chunked_delta_grad(ctx, grads):
    Q, K, beta, g, S0, X, T, u, r, P, states = ctx.saved_tensors
    dO, dS = unpack(grads[:ctx.has_Q + ctx.need_final], [ctx.has_Q, ctx.need_final])
    results = torch.ops.fw_fairseq.chunked_delta_backward(Q, K, beta, g, S0, X, T, u, r, P, states, dO, dS)
    dQ, dK, dV, dbeta, dg, dS0 = unpack(results, [Q is not None, True, True, True, g is not None, S0 is not None])
    return dQ, dK, dV, dbeta, dg, dS0, None, None


_chunked_delta_op.register_autograd(_chunked_delta_grad, setup_context=_chunked_delta_setup)


def apply_chunked_delta(Q, K, V, beta, g, S0, need_final, save):
    """ChunkedDelta.apply in eager, its custom op while torch.compile traces: (o or None, final state or None)."""
    if not torch.compiler.is_compiling():
        return ChunkedDelta.apply(Q, K, V, beta, g, S0, need_final, save)
    results = torch.ops.fw_fairseq.chunked_delta(Q, K, V, beta, g, S0, need_final, save)
    o, S = unpack(results, _delta_slots(Q, K, S0, need_final))[:2]
    return o, S


def chunked_delta(q, k, v, beta, initial_state=None, output_final_state=False, chunk_size=None):
    """Causal delta rule in the chunkwise WY/UT form (Yang et al., 2024): chunked_gated_delta with
    alpha = 1, which skips every decay. Returns (o [B, H, T, M] or None, state [B, H, E, M] or None)."""
    return chunked_gated_delta(q, k, v, beta, None, initial_state, output_final_state, chunk_size)


def chunked_gated_delta(q, k, v, beta, alpha, initial_state=None, output_final_state=False, chunk_size=None):
    """Causal gated delta rule, chunkwise (ChunkedDelta; README §8): W_t = alpha_t W_{t-1} +
    beta_t k_t (v_t - alpha_t W_{t-1}^T k_t)^T. alpha [B, H, T] in (0, 1], or None for alpha = 1.

    Returns (o [B, H, T, M] or None, state [B, H, E, M] or None). q may be None (a pure write, as in
    fast_weight_write): then no output is computed and o is None. chunk_size: the longest chunk;
    None picks one chunk up to DELTA_ONE_CHUNK_MAX positions, else chunks of DELTA_CHUNK_SIZE.
    """
    B, H, T, _ = k.shape
    dtype = state_dtype(k.dtype)
    if chunk_size is None:
        chunk_size = T if T <= DELTA_ONE_CHUNK_MAX else DELTA_CHUNK_SIZE
    C = balanced_chunk(T, chunk_size)
    K, V, Bt = (head_major_chunks(x, C, dtype) for x in (k, v, beta))  # [BH, N, C, E|M], [BH, N, C]
    Q = None if q is None else head_major_chunks(q, C, dtype)
    # cumulative log-gates within each chunk [BH, N, C]; the zero-padded tail is log(alpha = 1)
    g = None if alpha is None else head_major_chunks(alpha.to(dtype).log(), C, dtype).cumsum(-1)
    S0 = heads_state(initial_state, dtype)
    o, S = apply_chunked_delta(Q, K, V, Bt, g, S0, output_final_state, records(Q, K, V, Bt, g, S0))
    if o is not None:
        o = from_head_major(o, B, H, T)  # [B, H, T, M]
    return o, unflatten_state(S, B, H)
