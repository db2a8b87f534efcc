"""What the rules' reference loops share (the zero initial state, the per-position slices), and the
non-causal read of any rule's memory built by its loop."""


def zero_state(k, v, initial_state):
    if initial_state is not None:
        return initial_state
    B, H, _, E = k.shape
    return k.new_zeros(B, H, E, v.shape[-1])  # [B, H, E, M]


def steps(*tensors):
    """Per-position slices along T (dim 2). unbind, not x[:, :, t]: the backward of T index ops would
    build T full-size zero gradients (O(T^2) work); unbind's backward stacks once."""
    return [x.unbind(2) for x in tensors]


def naive_noncausal(rule, q, k, v, *scalars):
    """Non-causal memory read under `rule` (an UpdateRule): W = the state after its naive loop writes all T
    positions of k, v in order from W = 0; o = q W. q [B, H, Tq, E] (Tq may differ from T); k [B, H, T, E];
    v [B, H, T, M]; scalars [B, H, T] in rule.scalars' order. Returns o [B, H, Tq, M]."""
    _, W = rule.naive(k, k, v, *scalars, output_final_state=True)  # reading with q = k; W: [B, H, E, M]
    return q @ W  # [B, H, Tq, M]
