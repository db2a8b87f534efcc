"""The delta rules' records (paper §4.2; Gated DeltaNet, Yang et al. 2024), phi of keys and queries normalised:
- delta: W_t = W_{t-1} + beta_t phi(k_t) (v_t - W_{t-1}^T phi(k_t))^T, beta [B, H, T];
- gated delta: W_t = alpha_t W_{t-1} + beta_t phi(k_t) (v_t - alpha_t W_{t-1}^T phi(k_t))^T, alpha [B, H, T] in
  (0, 1] (not checked: that would synchronise a GPU at every call); alpha = 1 is the delta rule, whose forms are
  the gated ones with the decay skipped;
- delta_z (beyond the paper): the delta rule with the values' z column, o_t = W_t^T phi(q_t) / (z_t . phi(q_t)),
  z_t the same rule's memory of a constant 1. Each value column evolves on its own under the delta rule, so z is one
  more column of the same forms. While the writes are small against what a key holds (sum-normalised phi), W_t and
  z_t grow with the number of writes and the read is their ratio, a weighted mean of the values as the sum rule's;
  once a key's slot holds its value, z_t . phi(k_t) is 1 and the read is the delta rule's.
o_t = W_t^T phi(q_t). A padded position has beta = 0 (no write) and alpha = 1 (no decay)."""
from dataclasses import replace

from fw_fairseq.ops.rules.delta.fused import delta_fused, gated_delta_fused
from fw_fairseq.ops.rules.delta.short_read import delta_short_read
from fw_fairseq.ops.rules.delta.chunked import chunked_delta, chunked_gated_delta
from fw_fairseq.ops.rules.delta.naive import naive_delta, naive_gated_delta
from fw_fairseq.ops.rules.delta.step import in_place_step_delta, in_place_step_gated_delta, step_delta, step_gated_delta
from fw_fairseq.ops.rules.delta.writes import effective_writes
from fw_fairseq.ops.rules.record import UpdateRule


def delta_memory(k, v, beta, alpha=None):
    """The (gated) delta rule's final state without reading (no queries): [B, H, E, M]."""
    return chunked_gated_delta(None, k, v, beta, alpha, None, output_final_state=True)[1]


def delta_write_of(v, key_read, beta, *alpha):
    """One position's effective write u = beta (v - phi(k) W') from its key's read of the memory W' before it
    (already decayed; None: an empty memory). v, key_read [B, H, 1, M]; beta [B, H, 1]."""
    return beta[..., None] * (v if key_read is None else v - key_read)  # [B, H, 1, 1] * [B, H, 1, M]


def gated_decay_of(beta, alpha):
    """The gated rule's memory decays by alpha before each write."""
    return alpha


DELTA = UpdateRule(
    name="delta", scalars=("beta",), pad_values={"beta": 0.0}, normalised_phi=True, z_column=False,
    naive=naive_delta, chunked=chunked_delta, step=step_delta, memory=delta_memory, writes=effective_writes,
    key_reads=True, write_of=delta_write_of, in_place_step=in_place_step_delta,
    kernel="delta", kernel_memory=True, kernel_scalars=lambda beta: (beta, None), fused=delta_fused,
    short=delta_short_read,
)
GATED_DELTA = UpdateRule(
    name="gated_delta", scalars=("beta", "alpha"), pad_values={"beta": 0.0, "alpha": 1.0}, normalised_phi=True,
    z_column=False, naive=naive_gated_delta, chunked=chunked_gated_delta, step=step_gated_delta, memory=delta_memory,
    writes=effective_writes, key_reads=True, write_of=delta_write_of, decay_of=gated_decay_of,
    in_place_step=in_place_step_gated_delta, kernel="gated_delta", kernel_memory=True,
    kernel_scalars=lambda beta, alpha: (beta, alpha), fused=gated_delta_fused,
)
# no fused GPU read or CPU short read: both form the values from raw heads without the z column
DELTA_Z = replace(DELTA, name="delta_z", z_column=True, fused=None, short=None)
