"""The per-chunk states that ChunkedSum and ChunkedDelta keep for their backward passes."""
import torch


def stack_chunk_states(states, like):
    """The states before each chunk ([G, E, M], None while still zero) -> [G, N, E, M], or None when
    every one is zero (one chunk and no initial state: the outputs read no state)."""
    if all(S is None for S in states):
        return None
    G, E, M = next(S for S in states if S is not None).shape
    zero = like.new_zeros(G, E, M)
    return torch.stack([zero if S is None else S for S in states], 1)
