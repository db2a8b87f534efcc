"""The per-chunk states that ChunkedSum and ChunkedDelta keep for their backward passes."""
import torch


def stack_chunk_states(states, like):
    """The states before each chunk ([BH, E, M], None while still zero) -> [BH, N, E, M], or None when
    every one is zero (one chunk and no initial state: the outputs read no state)."""
    if all(S is None for S in states):
        return None
    BH, E, M = next(S for S in states if S is not None).shape
    zero = like.new_zeros(BH, E, M)
    return torch.stack([zero if S is None else S for S in states], 1)
