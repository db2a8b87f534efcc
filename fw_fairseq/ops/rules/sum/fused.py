"""The sum rule's fused GPU read (its record's `fused`, and `fused_aligned` with the aligned cross-attention's weight):
y = A v divided by the z column, phi formed on chip from the raw heads (fused_read.py, fused_kernels.py). Triton is
imported at the first call: fused_read/available.py."""
import torch

from fw_fairseq.ops.common.guards import records


def sum_fused(spec, q, k, v, scalars, causal, norm, key_padding_mask, align=None):
    """o [B, H, Tq, M] from the raw heads, already checked (fused_read/dispatch.py); a padded key reads nothing.
    align: None, or (P, qa [B, Tq], kb [B, T]) for sum_fused_aligned."""
    from fw_fairseq.ops.rules.sum import fused_read  # Triton: only once fused_read/available.py has imported it

    mask = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    if records(q, k, v):
        return fused_read.FusedSumRead.apply(q, k, v, mask, spec, causal, align)
    return fused_read.sum_forward(spec, q, k, v, mask, causal, align)[0]


def sum_fused_aligned(spec, q, k, v, order, angles, key_padding_mask):
    """The non-causal read of sum_fused with its scores weighed by cos^(2 order)((a_i - b_j) / 2), angles: (a
    [B, Tq], b [B, T]) of the queries and keys (fw_fairseq/modules/cross_align.py)."""
    return sum_fused(spec, q, k, v, (), False, None, key_padding_mask, (order, *angles))
