"""The rules' fused forms (each rule's record names its own: UpdateRule.fused) and the one lazy load of the kernels.

A form takes the raw heads already checked (dispatch.py) and returns the read o [B, H, Tq, M]. Triton is imported
at the first call, not here, so that a machine without it loses the fused read and nothing else.
"""
import logging

import torch

from ..guards import records, state_dtype

logger = logging.getLogger(__name__)
_kernels = None  # (launch, sum_read, delta_read) once imported, False where Triton is missing


def kernels():
    """The kernels' modules (launch, sum_read, delta_read), or False where Triton cannot be imported."""
    global _kernels
    if _kernels is None:
        try:
            from . import delta_read, launch, sum_read
            _kernels = (launch, sum_read, delta_read)
        except ImportError as err:
            logger.warning("the fused GPU read is not available (%s): phi is formed in memory instead", err)
            _kernels = False
    return _kernels


def sum_rule_read(spec, q, k, v, scalars, causal, norm, key_padding_mask):
    """The sum rule's fused form: y = A v, divided by the z column; a padded key reads nothing."""
    sum_read = kernels()[1]
    mask = None if key_padding_mask is None else key_padding_mask.to(torch.uint8).contiguous()
    if records(q, k, v):
        return sum_read.FusedSumRead.apply(q, k, v, mask, spec, causal)
    return sum_read.sum_forward(spec, q, k, v, mask, causal)[0]


def delta_rule_read(spec, q, k, v, scalars, causal, norm, key_padding_mask):
    """The delta rules' fused form, alpha the gated rule's second scalar. Padding is in the scalars' pad values
    (beta = 0, alpha = 1) and the zero value rows: no mask."""
    dtype = state_dtype(q.dtype)  # the module's scalars are fp32 beside half heads
    beta = scalars[0].to(dtype).contiguous()
    alpha = scalars[1].to(dtype).contiguous() if len(scalars) > 1 else None
    return kernels()[2].delta_read(spec, q, k, v, beta, alpha, causal, norm)
