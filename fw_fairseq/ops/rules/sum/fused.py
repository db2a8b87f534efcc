"""The sum rule's fused GPU read (its record's `fused`): y = A v divided by the z column, phi formed on chip from
the raw heads (fused_read.py, fused_kernels.py). Triton is imported at the first call: fused_read/available.py."""
import torch

from fw_fairseq.ops.common.guards import records


def sum_fused(spec, q, k, v, scalars, causal, norm, key_padding_mask):
    """o [B, H, Tq, M] from the raw heads, already checked (fused_read/dispatch.py); a padded key reads nothing."""
    from fw_fairseq.ops.rules.sum import fused_read  # Triton: only once fused_read/available.py has imported it

    mask = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    if records(q, k, v):
        return fused_read.FusedSumRead.apply(q, k, v, mask, spec, causal)
    return fused_read.sum_forward(spec, q, k, v, mask, causal)[0]
