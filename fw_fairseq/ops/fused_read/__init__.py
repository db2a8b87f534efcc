"""The fused GPU read: a whole attention block's read from the raw heads in Triton kernels, phi formed on chip.

q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M] are the module's raw heads (fp16, bf16 or fp32 on CUDA; any strides
with the last dim contiguous), phi a FeatureMap with a row form (DPFP-nu, ELU+1, Hedgehog, FAVOR+), the rule a
record with a fused form, its per-position scalars [B, H, T] (at their pad values where key_padding_mask [B, T] is
True), norm the delta rules' normalisation of phi. The same function as forming phi and running the rule's ops (the
sum rule's read divided by its z column), for T up to launch.MAX_T: causal (decoder self-attention, Tq = T),
non-causal (encoder) and cross (Tq != T). Forward and backward recompute phi from the raw heads per tile; no
[B, H, T, E] tensor is written.

Here: phi's tiles (phi_tiles.py), block shapes and checks (launch.py), the one lazy import of Triton
(available.py) and the decision where the fused read runs (dispatch.py: `takes`, `fused_read_for`). Each rule's
kernels live in its folder (rules/sum/fused*.py, rules/delta/fused*.py); the public entry point by a rule's name is
rules/public.py's `fused_read`.
"""
