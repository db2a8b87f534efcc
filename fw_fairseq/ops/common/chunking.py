"""Chunking for the rules' chunkwise-parallel PyTorch forms (the CPU path and the GPU fallback).

The sequence is cut into N chunks of C positions; within a chunk everything is dense matmuls, across chunks
only the state S [E, M] is carried (derivations: fw_fairseq/ops/README.md). A rule's chunked form
(rules/<rule>/chunked.py) turns its [B, H, T, D] inputs into [B*H, N, C, D] chunks here, runs its autograd
Function with a hand-written backward, and turns the outputs back. T need not be a multiple of C: the tail is
zero-padded (zero k and beta write nothing; zero q reads nothing; the gates' tail is alpha = 1, no decay).
Shapes are spelled out at every reshape, never -1: an empty batch (B or H = 0) has 0 elements, which no -1
can be inferred from.
"""
import torch.nn.functional as F


# Default (maximum) chunk lengths, from benchmarks on a 2-core CPU with 1 and 2 threads at
# B*H = 16..256 heads, T = 25..512. The sum rule is about as fast with 32 or 64 and takes 64. The
# delta rule is up to 30% faster with 32 once a sequence needs several chunks (its loop does more
# per chunk), but a sequence that fits in one chunk is cheaper as one (no loop, no state): a
# sequence of up to DELTA_ONE_CHUNK_MAX positions is one chunk, a longer one chunks of at most 32.
SUM_CHUNK_SIZE = 64
DELTA_CHUNK_SIZE = 32
DELTA_ONE_CHUNK_MAX = 64


def balanced_chunk(T, chunk_size):
    """The chunk length: the fewest chunks of at most chunk_size, made as equal as possible so the
    zero-padded tail is shorter than the number of chunks (T = 40, chunk_size 32: two chunks of 20,
    not 32 + 8 padded to 64). A short sequence (decoding: T = 1) is one small chunk."""
    n_chunks = -(-T // chunk_size)
    return -(-T // n_chunks)


def to_chunks(x, chunk_size):
    """[B, H, T, D] -> [B, H, N, C, D], zero-padding T up to N*C (also [B, H, T] -> [B, H, N, C])."""
    T = x.shape[2]
    pad = (-T) % chunk_size
    if pad:
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
    return x.reshape(*x.shape[:2], (T + pad) // chunk_size, chunk_size, *x.shape[3:])


def head_major_chunks(x, C, dtype):
    """[B, H, T, D] -> contiguous [B*H, N, C, D] in the compute dtype (a view when no copy is needed)."""
    return to_chunks(x.to(dtype), C).flatten(0, 1).contiguous()


def from_head_major(o, B, H, T):
    """[B*H, N, C, M] -> [B, H, T, M] (drops the padded tail; a view)."""
    return o.unflatten(0, (B, H)).flatten(2, 3)[:, :, :T]


def heads_state(state, dtype):
    """[B, H, E, M] -> contiguous [B*H, E, M] in the state dtype, or None."""
    return None if state is None else state.to(dtype).flatten(0, 1).contiguous()


def unflatten_state(S, B, H):
    """[B*H, E, M] -> [B, H, E, M]; None (not asked for) stays None."""
    return None if S is None else S.unflatten(0, (B, H))
