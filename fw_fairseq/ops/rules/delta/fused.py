"""The delta rules' fused GPU reads (their records' `fused`): the writes solved block by block with phi formed on
chip from the raw heads (fused_read.py, fused_kernels.py, fused_backward_kernels.py). Padding is in the scalars'
pad values (beta = 0, alpha = 1) and the zero value rows: no mask. Triton is imported at the first call:
fused_read/available.py."""


def delta_fused(spec, q, k, v, scalars, causal, norm, key_padding_mask):
    """The delta rule's o [B, H, Tq, M] from the raw heads, already checked (fused_read/dispatch.py): the gated
    kernels with alpha = 1, which skip every decay."""
    from fw_fairseq.ops.rules.delta import fused_read  # Triton: only once fused_read/available.py has imported it

    (beta,) = scalars
    return fused_read.delta_read(spec, q, k, v, beta, None, causal, norm)


def gated_delta_fused(spec, q, k, v, scalars, causal, norm, key_padding_mask):
    """The gated delta rule's o [B, H, Tq, M]."""
    from fw_fairseq.ops.rules.delta import fused_read

    beta, alpha = scalars
    return fused_read.delta_read(spec, q, k, v, beta, alpha, causal, norm)
