"""The delta rules' effective writes over a whole (short) sequence: the vectors u_s that they add to their
memory, W = sum_s phi(k_s)^T u_s, so that a read is (phi(q) phi(K)^T) U without forming the [E, M] memory
(the sum rule's are its values: u_s = v_s).

- delta rule: u_t = beta_t (v_t - sum_{s<t} (k_t . k_s) u_s), one unit lower triangular solve (README §2's
  UT form over one chunk with no initial state);
- gated delta rule: the pairs decayed by gamma_t / gamma_s, and W's decay gamma_S / gamma_s of each write
  folded into u_s (README §8).
Padded positions (zero value rows, beta = 0, alpha = 1) get u_s = 0. Used by fast_weight_attend's short
order and by cross-attention's cached source (fw_fairseq/decoding/source_memory.py).
"""
from typing import Optional

import torch
from torch import Tensor

from fw_fairseq.ops.rules.delta.chunk_gates import ChunkGates


def effective_writes(phi_k: Tensor, v: Tensor, beta: Tensor, alpha: Optional[Tensor] = None) -> Tensor:
    """U [B, H, S, M] with sum_s phi(k_s)^T u_s = the rule's memory of phi_k [B, H, S, E], v [B, H, S, M],
    beta [B, H, S] (alpha [B, H, S] given: the gated delta rule)."""
    bsz, heads, length, _ = phi_k.shape
    pairs = (phi_k @ phi_k.transpose(-1, -2)).tril(-1)  # [B, H, S, S], k_t . k_s for s < t
    gates = None
    if alpha is not None:
        # [B, H, S] -> [B H, 1 chunk, S]: g_t = sum_{s<=t} log alpha_s, every decay exp(g_t - g_s)
        gates = ChunkGates(alpha.log().cumsum(-1).reshape(bsz * heads, 1, length))
        pairs = pairs * gates.pair.view(bsz, heads, length, length)  # gamma_t / gamma_s
    eye = torch.eye(length, dtype=pairs.dtype, device=pairs.device)
    b = beta[..., None]  # [B, H, S, 1]
    # (I + diag(beta) X) U = diag(beta) V: row t is u_t = beta_t (v_t - sum_{s<t} X_ts u_s)
    u = torch.linalg.solve_triangular(eye + b * pairs, b * v, upper=False, unitriangular=True)
    if gates is not None:
        u = u * gates.write.view(bsz, heads, length, 1)  # gamma_S / gamma_s: W's decay of write s
    return u
