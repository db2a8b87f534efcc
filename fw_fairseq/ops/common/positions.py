"""Reads whose kernel carries the positions: phi(q_i) . phi(k_j) times g(i) . h(j), with R positional factors g(i),
h(j) per position (e.g. the aligned cross-attention's, fw_fairseq/modules/cross_align.py).

That kernel is a plain dot product of wider features, phi(x) (x) g: the memory of a fast weight read is written
over them, and (phi(q) (x) g(i)) . (phi(k) (x) h(j)) = (phi(q) . phi(k)) (g(i) . h(j)) lets the short order weigh
its scores instead (dispatch.attend)."""


def per_head(factors):
    """Positional factors shared by the heads [B, T, R] or per head [B, H, T, R] -> [B, 1 or H, T, R]."""
    return factors[:, None] if factors.dim() == 3 else factors


def with_positions(x, factors):
    """x [B, H, T, E] (x) factors [B, T, R] (or per head, [B, H, T, R]) -> [B, H, T, R E]: block r is x times
    factor r."""
    B, H, T, E = x.shape
    factors = per_head(factors)  # [B, 1 or H, T, R]
    wide = factors[..., None].to(x.dtype) * x[:, :, :, None, :]  # [B, H, T, R, E]
    return wide.reshape(B, H, T, -1)


def position_weight(q_factors, k_factors):
    """The positional weight g(i) . h(j) of queries' factors [B, Tq, R] and keys' [B, T, R] -> [B, 1, Tq, T] (per
    head, [B, H, Tq, R] and [B, H, T, R] -> [B, H, Tq, T])."""
    return per_head(q_factors) @ per_head(k_factors).transpose(-1, -2)
