"""The fused GPU read: a whole attention block's read from the raw heads in Triton kernels, phi formed on chip.

    o = fused_read(phi, rule, q, k, v, scalars, causal, norm=None, key_padding_mask=None)

q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M] are the module's raw heads (fp16, bf16 or fp32 on CUDA; any strides
with the last dim contiguous), phi a FeatureMap with a row form (DPFP-nu, ELU+1, Hedgehog, FAVOR+), rule a RULES
name, scalars its per-position scalars [B, H, T] (at their pad values where key_padding_mask [B, T] is True), norm
the delta rules' normalisation of phi. The same function as forming phi and running the rule's ops (the sum rule's
read divided by its z column), for T up to launch.MAX_T: causal (decoder self-attention, Tq = T), non-causal
(encoder) and cross (Tq != T). Forward and backward recompute phi from the raw heads per tile; no [B, H, T, E]
tensor is written. Kernels: sum_kernels.py (sum rule), delta_kernels.py (delta rules); phi: phi_tiles.py.

`fused_read_for` is the module's dispatch: the fused read where it runs and is the faster path, else None (the
caller forms phi and runs the rule's ops or kernels). Triton is imported only there, so a machine without it
loses the fused read and nothing else.
"""
__all__ = ["fused_read", "fused_read_for", "takes"]


def __getattr__(name):
    # dispatch.py reads the rules' table, and rules.py this package's forms.py: the package itself imports neither
    # until a name of dispatch's is asked for, so that importing rules.py makes no circle through it
    if name in __all__:
        from . import dispatch
        return getattr(dispatch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
