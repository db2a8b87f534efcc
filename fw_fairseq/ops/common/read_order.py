"""The one choice of order of a non-causal read (fast_weight_attend's, and the CPU kernels' short read's)."""


def short_order(Tq, T, E, M):
    """Whether a non-causal read of Tq queries from T written positions (E-wide keys, M-wide values) costs fewer
    multiply-adds as (q k^T) U than as q W through the [E, M] memory: fast_weight_attend's choice of order."""
    return Tq * T * (E + M) < (Tq + T) * E * M
