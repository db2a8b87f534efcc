"""The lazy decoding state of causal fast-weight attention: the writes, not the state, while short.

A decoding step of the state form reads and writes the [E, M] fast weight whatever the output
length t. Until that pays, the decoder self-attention keeps instead what was written: the keys'
features phi(k_s) and the effective writes u_s, the exact vectors added to the state:

    W_t = sum_{s<=t} c_s phi(k_s)^T u_s,        o_t = phi(q_t) W_t = sum_{s<=t} c_s (phi(q_t) . phi(k_s)) u_s

- sum rule: u_s = [v_s; 1] (the z column), c_s = 1;
- delta rule: u_t = beta_t (v_t - phi(k_t) W_{t-1}) = beta_t (v_t - sum_{s<t} c_s (phi(k_t) . phi(k_s)) u_s);
- gated delta: as the delta rule with the decays c_s = alpha_{s+1} ... alpha_t (gamma_t / gamma_s),
  kept as a running product (multiplied by alpha_t at each step, 1 for the new position): no
  division by a vanishing gamma_s. With W_{t-1} decayed by alpha_t first, u_t is step.py's
  u = beta (v - alpha k S).
Same functions as ops.step / ops.naive; tests/ops/test_ops_lazy.py checks them in float64.

phi(k_s) is cached, not recomputed from the d-wide raw keys: on the shared 2-core CPU (B H = 128,
DPFP-2, E = 256, t = 64) recomputing phi of the cached keys took 7.4 ms a step and appending one
cached row 0.2 ms, against 3-11 ms for the whole state-form layer step. A step then reads
t (E + M) values and the state form E M, so the module folds the writes into the state (`fold`)
once t (E + M) passes E M (`fits`) and continues with the fixed-size step. Padded positions need
no care: their phi(k) is zero (and their beta zero), so they read and write nothing.
Shapes head-first: phi_q, phi_k [B, H, 1, E], phi_past [B, H, t-1, E], writes [B, H, t-1, M],
decay [B, H, t-1], v [B, H, 1, M], beta, alpha [B, H, 1].
"""
from typing import Optional, Tuple

import torch
from torch import Tensor


def fits(length: int, d_phi: int, width: int) -> bool:
    """Whether a step over `length` cached positions, reading length (d_phi + width) values,
    reads no more than the [d_phi, width] state it replaces."""
    return length * (d_phi + width) <= d_phi * width


def lazy_step(phi_q: Tensor, phi_k: Tensor, v: Tensor, phi_past: Optional[Tensor],
              writes: Optional[Tensor], decay: Optional[Tensor], beta: Optional[Tensor] = None,
              alpha: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """One decoding step from the past positions' features and writes (None before the first).

    beta None: the sum rule (u_t = v_t, the caller's v carries the z column); beta given: the
    delta rule, gated by alpha if given. Returns (o [B, H, 1, M], phi_keys [B, H, t, E],
    writes [B, H, t, M], decay [B, H, t] for the gated rule else None)."""
    if decay is not None and alpha is not None:
        decay = decay * alpha  # [B, H, t-1] * [B, H, 1]: c_s = gamma_t / gamma_s
    u = v
    if writes is None:
        past = None
    else:
        # the query's row and, for the delta rule, the new key's row read the past in one matmul
        rows = phi_q if beta is None else torch.cat([phi_q, phi_k], dim=2)  # [B, H, 1 or 2, E]
        scores = rows @ phi_past.transpose(-1, -2)  # [B, H, 1 or 2, t-1]
        if decay is not None:
            scores = scores * decay[:, :, None, :]
        past = scores @ writes  # [B, H, 1 or 2, M]
        if beta is not None:
            u = v - past[:, :, 1:]  # v_t - phi(k_t) W_{t-1}
        past = past[:, :, :1]  # phi(q_t) W_{t-1}
    if beta is not None:
        u = beta[..., None] * u  # [B, H, 1, 1] * [B, H, 1, M]
    own = (phi_q * phi_k).sum(-1, keepdim=True) * u  # [B, H, 1, M]: position t reads its own write
    o = own if past is None else past + own
    phi_keys = phi_k if phi_past is None else torch.cat([phi_past, phi_k], dim=2)  # [B, H, t, E]
    writes = u if writes is None else torch.cat([writes, u], dim=2)  # [B, H, t, M]
    if alpha is not None:
        one = alpha.new_ones(alpha.shape)  # [B, H, 1]: the new position is not decayed yet
        decay = one if decay is None else torch.cat([decay, one], dim=2)  # [B, H, t]
    return o, phi_keys, writes, decay


def fold(phi_k: Tensor, writes: Tensor, decay: Optional[Tensor]) -> Tensor:
    """The state of the cached positions, W = sum_s c_s phi(k_s)^T u_s:
    phi_k [B, H, t, E], writes [B, H, t, M], decay [B, H, t] or None -> [B, H, E, M]."""
    if decay is not None:
        phi_k = phi_k * decay[..., None]  # [B, H, t, E]
    return phi_k.transpose(-1, -2) @ writes
