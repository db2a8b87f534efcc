"""A short sequence's read from the raw heads, one op where a kernel forms phi of a head's rows itself: the fused
Triton read on CUDA (fw_fairseq/ops/fused_read/, the rule's `fused`), the CPU kernels elsewhere (the rule's `short`:
rules/sum/short_read.py, rules/delta/short_read.py). A short sequence reads in the order (q k^T) v: its products of
features are [T, T] per head, where forming phi writes [B, H, T, E] tensors that, with their gradients, cost the
plain composition more than the products on a training batch. Where neither kernel takes the block, the caller
forms phi and runs the rule: the same function (fw_fairseq/ops/README.md §12, §13). The CPU kernels' products call
BLAS where the loaded torch exports it, else their own loops (cpu_extension.BLAS = False takes the loops anyway: the
tests run both); they read the heads in their own layout (the module's are views of [T, B, C]) and write dq and dk
in it.
"""
from fw_fairseq.ops.fused_read import dispatch as fused_read
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS, cpu_kernel


def short_read(phi, rule, q, k, v, scalars, key_padding_mask, causal, norm):
    """The read [B, H, Tq, M] of `rule` (an UpdateRule; the sum rule's divided by its z column) with the features of
    `phi` (a FeatureMap) from the raw heads q [B, H, Tq, d_key], k [B, H, T, d_key], values v [B, H, T, M] and the
    rule's scalars [B, H, T] (all at their pad values where key_padding_mask [B, T] is True), phi normalised by `norm`
    where the rule normalises it; None where no kernel takes the block. A map without a row form (phi.kernel_map
    None) has neither read: its phi cannot be formed inside a kernel."""
    if phi.kernel_map is None:
        return None
    if fused_read.takes(q):  # CUDA: the fused Triton read, at every length it takes
        return fused_read.fused_read_for(phi, rule, q, k, v, scalars, causal, norm, key_padding_mask)
    return cpu_short_read(phi.kernel_map, phi.kernel_nu, phi.out_dim, rule, q, k, v, scalars, causal, norm,
                          key_padding_mask, phi.kernel_projection)


def cpu_short_read(map_name, nu, width, rule, q, k, v, scalars, causal, norm, key_padding_mask=None, projection=None):
    """The read y [B, H, Tq, M] of rule `rule` (an UpdateRule; its record's `short` runs it on the CPU kernels) with the features of map `map_name` (a KERNEL_MAPS
    name; nu: DPFP's, else ignored; projection: FAVOR+'s R [m, d], else None; width: its E) of raw heads
    q [B, H, Tq, d] and k [B, H, T, d], values v [B, H, T, M] (0 at padded positions) and the rule's scalars
    ([B, H, T] each, at their pad values there), phi normalised by `norm` where the rule normalises it;
    key_padding_mask [B, T], True at padding. The sum rule's read is divided by its z
    column. None where it does not run: a rule or order without a read here, no kernel (not built, not
    float32/float64 CPU tensors, torch.compile tracing), an empty sequence, or mixed dtypes; the caller then forms
    phi and runs the rule, the same function."""
    kernel = cpu_kernel(q)
    if (not kernel or rule.short is None or q.shape[2] == 0 or k.shape[2] == 0
            or any(x.dtype != q.dtype for x in (k, v, *scalars))):
        return None
    if projection is not None:
        projection = projection.to(q.dtype)  # a float32 buffer; the kernel computes in q's dtype
    return rule.short(kernel, (KERNEL_MAPS[map_name], nu, projection), width, q, k, v, scalars, causal, norm,
                        key_padding_mask)
