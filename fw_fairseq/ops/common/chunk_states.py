"""The per-chunk results that ChunkedSum and ChunkedDelta collect in their loops, and the per-chunk states
they keep for their backward passes."""
import torch


def stack_chunks(xs):
    """Per-chunk tensors [BH, ...] -> [BH, N, ...]. One chunk (a sentence of at most 64 positions, most of a
    translation batch) is a view: stacking it would copy it, which cost as much as one of its matmuls."""
    return xs[0].unsqueeze(1) if len(xs) == 1 else torch.stack(xs, 1)


def stack_chunk_states(states, like):
    """The states before each chunk ([BH, E, M], None while still zero) -> [BH, N, E, M], or None when
    every one is zero (one chunk and no initial state: the outputs read no state)."""
    if all(S is None for S in states):
        return None
    BH, E, M = next(S for S in states if S is not None).shape
    zero = like.new_zeros(BH, E, M)
    return stack_chunks([zero if S is None else S for S in states])
