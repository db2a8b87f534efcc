"""The T = 1 forms of the causal rules (a decoding step): one outer-product update and one read,
without the chunk machinery's small-op overhead. Same functions as the chunked forms at T = 1
(tests/ops/test_ops_step.py checks them against naive.py, outputs, states and gradients).

q, k [B, H, 1, E]; v [B, H, 1, M]; beta, alpha [B, H, 1]; state [B, H, E, M] or None (zero).
Computed and returned in guards.state_dtype (float32 for fp16/bf16 inputs).
"""
import torch

from .cpu_extension import KERNEL_MAPS, KERNEL_NORMS, cpu_kernel
from .guards import state_dtype
from .normalize_function import PHI_EPS
from .z_column import Z_EPS


def _add_outer(S0, k, u):
    """S0 + k^T u over [B, H] in one fused baddbmm (no temporary [B, H, E, M] outer product).

    S0 [B, H, E, M] or None; k [B, H, 1, E]; u [B, H, 1, M] -> [B, H, E, M]."""
    (B, H, _, E), M = k.shape, u.shape[-1]
    kt, ut = k.reshape(B * H, 1, E).transpose(1, 2), u.reshape(B * H, 1, M)  # [BH, E, 1], [BH, 1, M]
    if S0 is None:
        return (kt @ ut).view(B, H, E, M)
    return torch.baddbmm(S0.reshape(B * H, E, M), kt, ut).view(B, H, E, M)


def _cast(dtype, initial_state, *tensors):
    return [x.to(dtype) for x in tensors] + [None if initial_state is None else initial_state.to(dtype)]


def step_sum(q, k, v, initial_state=None, output_final_state=False):
    """S + k^T v, o = q S."""
    q, k, v, S0 = _cast(state_dtype(q.dtype), initial_state, q, k, v)
    S = _add_outer(S0, k, v)  # [B, H, E, M]
    return q @ S, (S if output_final_state else None)


def step_delta(q, k, v, beta, initial_state=None, output_final_state=False):
    """u = beta (v - k S), S + k^T u, o = q S."""
    return step_gated_delta(q, k, v, beta, None, initial_state, output_final_state)


def step_gated_delta(q, k, v, beta, alpha, initial_state=None, output_final_state=False):
    """S' = alpha S (alpha None: 1), u = beta (v - k S'), S' + k^T u, o = q S'."""
    q, k, v, beta, S0 = _cast(state_dtype(q.dtype), initial_state, q, k, v, beta)
    if S0 is not None and alpha is not None:
        S0 = alpha.to(S0.dtype)[..., None] * S0  # [B, H, 1, 1] * [B, H, E, M]
    u = v if S0 is None else v - k @ S0  # [B, H, 1, M]: v - W_{t-1}^T k
    S = _add_outer(S0, k, beta[..., None] * u)  # [B, H, E, M]
    return q @ S, (S if output_final_state else None)


def step_in_place(q, k, v, beta, alpha, state, order=None, out=None):
    """A decoding step of any rule, for generation only (no autograd through the state): the sum rule
    (beta and alpha None; the z column rides in v), the delta rule (beta) or the gated delta rule (beta
    and alpha). The hypotheses continue the rows `order` [B] of state [B', H, E, M] (beam search's
    reorder; None: all rows, in order), and their new state goes into `out` [B, H, E, M] (a contiguous
    storage apart from state; None: state itself, updated in place). Returns o [B, H, 1, M].
    Same function as the step_* forms above (tests/ops/test_ops_step.py):
    o = q S' + (q . k) u with S' = alpha S (alpha None: S), u = beta (v - k S') (sum rule: v).

    The out-of-place step writes a new [E, M] state per head and step, a fresh allocation that cost
    2.1 ms against 0.5 ms in place (B H = 128, E = 256, M = 64, one CPU thread); a reorder apart from the
    step copies every state first. The CPU kernel (cpu/state_step.cpp) reads each state once for q and
    k, gathered from its `order` row, and writes it once; the PyTorch form gathers, then steps in place."""
    out = state if out is None else out
    kernel = cpu_kernel(state)
    if kernel and state.is_contiguous() and out.is_contiguous():
        return kernel.state_step(q, k, v, beta, alpha, state, order, out)
    if order is not None:
        torch.index_select(state, 0, order, out=out)
    q, k, v = (x.to(out.dtype) for x in (q, k, v))
    if alpha is not None:
        out.mul_(alpha.to(out.dtype)[..., None])  # [B, H, 1, 1]: S' = alpha S
    rows = q if beta is None else torch.cat([q, k], dim=2)  # [B, H, 1 or 2, E]
    read = rows @ out  # [B, H, 1 or 2, M]: q S' and k S'
    u = v if beta is None else beta.to(out.dtype)[..., None] * (v - read[:, :, 1:])  # [B, H, 1, M]
    o = read[:, :, :1] + (q * k).sum(-1, keepdim=True) * u  # q (S' + k^T u)
    (B, H, _, E), M = k.shape, u.shape[-1]
    # [B, H, E, M] viewed as [B H, E, M] += [B H, E, 1] @ [B H, 1, M]
    out.view(B * H, E, M).baddbmm_(k.reshape(B * H, 1, E).transpose(1, 2), u.reshape(B * H, 1, M))
    return o


def fused_lazy_step(phi_q, phi_k, v, beta, keys, writes, decay, order, outs, key, nu=0, norm=None, eps=PHI_EPS):
    """Generation's step over a lazy cache (decoder_state.lazy_step) on the CPU kernel (cpu/lazy_step.cpp),
    which scores and reads the cache in one pass and appends the step's row: (o, u), each [B, H, 1, M]; None
    where the kernel does not take the tensors. keys [B', H, t-1, C]: DPFP-nu's raw keys (C = d), or with
    nu 0 the features themselves (C = E); writes [B', H, t-1, M]. order [B] or None: the hypotheses read
    rows `order` of the caches (beam search's reorder, left to this step). outs (keys_out, writes_out),
    views of t positions: the rows read (copied unless they are the caches' own memory), then at position
    t-1 the row `key` [B, H, 1, C] and the write u / max(norm_of(phi(key), norm), eps) (norm None: u)."""
    kernel = cpu_kernel(keys)
    if not kernel:
        return None
    return kernel.lazy_step(phi_q, phi_k, v, beta, keys, writes, decay, nu, order, *outs, key, KERNEL_NORMS[norm], eps)


def raw_lazy_step(map_name, nu, projection, q, k, v, beta, keys, writes, decay, order, lineage, norm, z_column):
    """fused_lazy_step from the raw rows q, k [B, H, 1, d] (cpu/raw_step.cpp's raw_lazy_step): the kernel forms phi
    of map `map_name` (a KERNEL_MAPS name; nu: DPFP's; projection: FAVOR+'s R [m, d], else None) normalised by
    `norm` (None: not), gives v [B, H, 1, D] the sum rule's z column where `z_column` and divides the read by it.
    keys [B', H, t-1, C]: DPFP's raw keys (C = d), else phi(k) (C = E); writes [B', H, t-1, D (+ 1)]; both views of
    storages with room for position t-1 (cache_storage.room), where each hypothesis appends its row in its own row b;
    traced by a reorder `order` or a `lineage` [B'', t-1] (hypothesis b's position s is in row lineage[order[b], s] of
    the caches): nothing copied. -> (o [B, H, 1, D], the module's read, or None where the storages have no room and
    nothing ran; traced: the lineage [B, t] of the next step, else None; keys and writes, the views of t positions).
    Where raw_step_kernel."""
    projection = None if projection is None else projection.to(q.dtype)  # a float32 buffer: q's dtype
    return cpu_kernel(q).raw_lazy_step(q, k, v, beta, keys, writes, decay, KERNEL_MAPS[map_name], nu, projection,
                                       order, lineage, KERNEL_NORMS[norm], PHI_EPS, z_column, Z_EPS)


def raw_step_kernel(map_name, q, keys):
    """Whether raw_lazy_step takes these tensors: a map with a row form (map_name not None), the kernel built and
    taking q, and the cache in q's dtype."""
    return map_name is not None and cpu_kernel(q) is not None and keys.dtype == q.dtype


def raw_source_read(map_name, nu, projection, q, source, norm, z_column):
    """Generation's cross-attention read of a cached source (source_memory.read_source, the keys' phi and writes
    [R, H, S, E + M] or the memory [R, H, E, M]; hypothesis b reads row b / (B / R)) from the raw query rows q
    [B, H, 1, d] on the CPU kernel (cpu/source_read.cpp), phi(q) of map `map_name` normalised by `norm` (None: not),
    divided by the z column where `z_column`: o [B, H, 1, D]. Where raw_step_kernel."""
    projection = None if projection is None else projection.to(q.dtype)
    return cpu_kernel(q).raw_source_read(q, source, KERNEL_MAPS[map_name], nu, projection, KERNEL_NORMS[norm],
                                         PHI_EPS, z_column, Z_EPS)
