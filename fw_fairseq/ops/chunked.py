"""Chunkwise-parallel causal fast weights in pure PyTorch (the CPU path and the GPU fallback).

The sequence is cut into N chunks of C positions; within a chunk everything is dense matmuls,
across chunks only the state S [E, M] is carried. Derivations: fw_fairseq/ops/README.md.
The work is done by two autograd Functions with hand-written backward passes
(chunked_sum_function.py, chunked_delta_function.py; while torch.compile traces, their custom ops
in custom_ops.py); they keep one state per chunk, never one per position, so backward memory is
O(N E M + T (E + M + C)) per head instead of O(T E M).
This file turns [B, H, T, D] inputs into their [B*H, N, C, D] chunks and back.
The T = 1 decoding steps, which need no chunks, are in step.py.

Shapes: q, k [B, H, T, E]; v [B, H, T, M]; beta, alpha [B, H, T]; state [B, H, E, M]. T need not be a
multiple of C: the tail is zero-padded (zero k and beta write nothing; zero q reads nothing; the
gates' tail is alpha = 1, no decay).
fp16/bf16 inputs are computed and accumulated in float32, and outputs and state stay float32
(guards.state_dtype). Shapes are spelled out at every reshape, never -1: an empty batch (B or H = 0)
has 0 elements, which no -1 can be inferred from.
"""
import torch.nn.functional as F

from .custom_ops import apply_chunked_delta, apply_chunked_sum
from .guards import records, state_dtype

# Default (maximum) chunk lengths, from benchmarks on a 2-core CPU with 1 and 2 threads at
# B*H = 16..256 heads, T = 25..512. The sum rule is about as fast with 32 or 64 and takes 64. The
# delta rule is up to 30% faster with 32 once a sequence needs several chunks (its loop does more
# per chunk), but a sequence that fits in one chunk is cheaper as one (no loop, no state): a
# sequence of up to DELTA_ONE_CHUNK_MAX positions is one chunk, a longer one chunks of at most 32.
SUM_CHUNK_SIZE = 64
DELTA_CHUNK_SIZE = 32
DELTA_ONE_CHUNK_MAX = 64


def _balanced_chunk(T, chunk_size):
    """The chunk length: the fewest chunks of at most chunk_size, made as equal as possible so the
    zero-padded tail is shorter than the number of chunks (T = 40, chunk_size 32: two chunks of 20,
    not 32 + 8 padded to 64). A short sequence (decoding: T = 1) is one small chunk."""
    n_chunks = -(-T // chunk_size)
    return -(-T // n_chunks)


def _to_chunks(x, chunk_size):
    """[B, H, T, D] -> [B, H, N, C, D], zero-padding T up to N*C (also [B, H, T] -> [B, H, N, C])."""
    T = x.shape[2]
    pad = (-T) % chunk_size
    if pad:
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
    return x.reshape(*x.shape[:2], (T + pad) // chunk_size, chunk_size, *x.shape[3:])


def _head_major_chunks(x, C, dtype):
    """[B, H, T, D] -> contiguous [B*H, N, C, D] in the compute dtype (a view when no copy is needed)."""
    return _to_chunks(x.to(dtype), C).flatten(0, 1).contiguous()


def _from_head_major(o, B, H, T):
    """[B*H, N, C, M] -> [B, H, T, M] (drops the padded tail; a view)."""
    return o.unflatten(0, (B, H)).flatten(2, 3)[:, :, :T]


def _heads_state(state, dtype):
    """[B, H, E, M] -> contiguous [B*H, E, M] in the state dtype, or None."""
    return None if state is None else state.to(dtype).flatten(0, 1).contiguous()


def _unflatten_state(S, B, H):
    """[B*H, E, M] -> [B, H, E, M]; None (not asked for) stays None."""
    return None if S is None else S.unflatten(0, (B, H))


def chunked_sum(q, k, v, initial_state=None, output_final_state=False, chunk_size=SUM_CHUNK_SIZE):
    """Causal sum rule, parallel over chunks (ChunkedSum). Returns (o [B, H, T, M], state or None).

    o_chunk = Q S_before + tril(Q K^T) V, where S_before is the exclusive prefix sum of K_n^T V_n.
    """
    B, H, T, _ = q.shape
    dtype = state_dtype(q.dtype)
    C = _balanced_chunk(T, chunk_size)
    Q, K, V = (_head_major_chunks(x, C, dtype) for x in (q, k, v))  # [BH, N, C, E|M]
    S0 = _heads_state(initial_state, dtype)
    o, S = apply_chunked_sum(Q, K, V, S0, output_final_state, records(Q, K, V, S0))
    return _from_head_major(o, B, H, T), _unflatten_state(S, B, H)  # o [B, H, T, M]


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
    C = _balanced_chunk(T, chunk_size)
    K, V, Bt = (_head_major_chunks(x, C, dtype) for x in (k, v, beta))  # [BH, N, C, E|M], [BH, N, C]
    Q = None if q is None else _head_major_chunks(q, C, dtype)
    # cumulative log-gates within each chunk [BH, N, C]; the zero-padded tail is log(alpha = 1)
    g = None if alpha is None else _head_major_chunks(alpha.to(dtype).log(), C, dtype).cumsum(-1)
    S0 = _heads_state(initial_state, dtype)
    o, S = apply_chunked_delta(Q, K, V, Bt, g, S0, output_final_state, records(Q, K, V, Bt, g, S0))
    if o is not None:
        o = _from_head_major(o, B, H, T)  # [B, H, T, M]
    return o, _unflatten_state(S, B, H)
