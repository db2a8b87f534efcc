"""The one choice of order of a non-causal read (fast_weight_attend's, and the CPU kernels' short read's)."""


def short_order(Tq, T, E, M, R=1):
    """Whether a non-causal read of Tq queries from T written positions (E-wide keys, M-wide values) costs fewer
    multiply-adds as (q k^T) U than as q W through the [E R, M] memory: fast_weight_attend's choice of order.
    R > 1: a read whose kernel carries R positional factors (dispatch.attend's `positions`), whose memory is over
    features R times wider while the short order only weighs its scores."""
    return Tq * T * (E + M) < (Tq + T) * E * R * M
