"""The decoding steps' two backends, one chosen per step entry (`backend`): the compiled CPU kernels (csrc/cpu:
lazy_step.cpp, raw_step.cpp, source_read.cpp, state_step.cpp) or PyTorch ops, the same functions
(tests/ops/test_ops_lazy.py, tests/modules/test_raw_step.py and tests/models/test_source_cache.py compare them in
float64).

The kernels take the steps of a rule whose record gives their arguments (UpdateRule.kernel_scalars) and a map with a
row form in them (FeatureMap.kernel_map: they form phi of raw rows themselves), on float32 or float64 CPU tensors of
one dtype (cpu_extension.cpu_kernel; not while torch.compile traces). Every other step takes PyTorch ops. The kernels
have no backward: the steps that write the caches in place run in generation only (cache_storage.in_place; with
autograd they concatenate in PyTorch), and the cross-attention's read, which writes nothing, whenever the kernel takes
it: decoding is not trained through. A backend steps
- `lazy_step`: generation's step over the lazy cache: its rows read (gathered through beam search's reorder where
  one is left to the step: the kernel copies them as it scores them), and this position's row appended;
- `state_step`: generation's step of the folded state [B', H, E, M], in place or into its spare;
and with `raw` (the kernels) from the raw heads, phi formed in the kernel: `raw_step`, the decoder self-attention's
lazy step, and `source_read`, the cross-attention's read of a cached source. With PyTorch the caller forms phi first.
Shapes head-first as in decoder_state.py.
"""
from functools import lru_cache
from typing import Optional, Tuple

import torch
from torch import Tensor

from fw_fairseq.ops.common.z_column import Z_EPS
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS, KERNEL_NORMS, cpu_kernel
from fw_fairseq.ops.maps.normalize_function import PHI_EPS


def lazy_read(rule, cache, phi_q: Tensor, phi_k: Tensor, v: Tensor, keys: Optional[Tensor], writes: Optional[Tensor],
              decay: Optional[Tensor], scalars: Tuple[Tensor, ...]) -> Tuple[Tensor, Tensor]:
    """The lazy step's read in PyTorch ops: (o [B, H, 1, M], the step's write u [B, H, 1, M]) from the cache's rows
    keys [B, H, t-1, C] (as `cache`, a key_cache object, keeps them) and writes [B, H, t-1, M] (None: empty), each
    scaled by its decay [B, H, t-1] (None: a rule without decay), this step's factor included."""
    key_read = None
    if writes is None:
        past = None
    else:
        # the query's row and, where the rule's write reads the memory at its key, the key's row: one pass
        rows = torch.cat([phi_q, phi_k], dim=2) if rule.key_reads else phi_q  # [B, H, 1 or 2, E]
        scores = cache.scores(rows, keys)  # [B, H, 1 or 2, t-1]
        if decay is not None:
            scores = scores * decay[:, :, None, :]
        past = scores @ writes  # [B, H, 1 or 2, M]
        key_read = past[:, :, 1:] if rule.key_reads else None  # phi(k_t) W_{t-1}
        past = past[:, :, :1]  # phi(q_t) W_{t-1}
    u = rule.write_of(v, key_read, *scalars)  # [B, H, 1, M]
    own = (phi_q * phi_k).sum(-1, keepdim=True) * u  # [B, H, 1, M]: position t reads its own write
    return (own if past is None else past + own), u


class TorchBackend:
    """The steps in PyTorch ops."""

    raw = False  # no step from the raw heads: the caller forms phi

    @staticmethod
    def lazy_step(rule, cache, phi_q: Tensor, phi_k: Tensor, v: Tensor, scalars, keys: Tensor, writes: Tensor,
                  decay: Optional[Tensor], order: Optional[Tensor], outs: Tuple[Tensor, Tensor], key: Tensor,
                  norm: Optional[str]) -> Tensor:
        """o [B, H, 1, M] of generation's lazy step: the rows `order` [B] of keys and writes [B', H, t-1, .] (None:
        all, in place) into the first t-1 positions of outs (views [B, H, t, .]), then this step's row `key` and its
        write at position t-1."""
        past = tuple(out[:, :, :-1] for out in outs)  # [B, H, t-1, .]
        if order is not None:  # gathered before the read: no op here copies as it reads
            for cached, out in zip((keys, writes), past):
                torch.index_select(cached, 0, order, out=out)
        o, u = lazy_read(rule, cache, phi_q, phi_k, v, *past, decay, scalars)
        outs[0][:, :, -1:] = key
        outs[1][:, :, -1:] = cache.kept_write(u, key, norm)
        return o

    @staticmethod
    def state_step(rule, q: Tensor, k: Tensor, v: Tensor, scalars, state: Tensor, order: Optional[Tensor],
                   out: Optional[Tensor]) -> Tensor:
        """o [B, H, 1, M] of generation's step of the state [B', H, E, M] from its rows `order` [B] (None: all)
        into `out` (None: state itself): the rule's in-place step."""
        return rule.in_place_step(q, k, v, *scalars, state, order, out)


class KernelBackend:
    """The steps on the compiled CPU kernels `kernel` (fw_fairseq._cpu)."""

    raw = True

    def __init__(self, kernel):
        self.kernel = kernel

    def lazy_step(self, rule, cache, phi_q, phi_k, v, scalars, keys, writes, decay, order, outs, key, norm):
        """TorchBackend.lazy_step in one call (csrc/cpu/lazy_step.cpp), which copies the rows it reads into outs
        (non-temporal stores: they are read again only at the next step)."""
        beta = rule.kernel_scalars(*scalars)[0]  # a decay reaches the kernel as the cache's decays, `decay`
        nu, norm = cache.kernel_args(norm)
        return self.kernel.lazy_step(phi_q, phi_k, v, beta, keys, writes, decay, nu, order, *outs, key,
                                     KERNEL_NORMS[norm], PHI_EPS)[0]

    def state_step(self, rule, q, k, v, scalars, state, order, out):
        """TorchBackend.state_step in one call (csrc/cpu/state_step.cpp: each state read once for q and k, written
        once). state and out are contiguous (decoder_state.step_state)."""
        return self.kernel.state_step(q, k, v, *rule.kernel_scalars(*scalars), state, order,
                                      state if out is None else out)

    def raw_step(self, block, q: Tensor, k: Tensor, v: Tensor, scalars, keys: Tensor, writes: Tensor,
                 decay: Optional[Tensor], order: Optional[Tensor], lineage: Optional[Tensor]):
        """The lazy step from the raw rows q, k [B, H, 1, d] (csrc/cpu/raw_step.cpp): phi normalised as the block
        says, the sum rule's z column added to v [B, H, 1, D] and divided out of the read where the rule has one.
        keys, writes [B', H, t-1, .]: views of storages with room for position t-1 (cache_storage.room), where
        hypothesis b appends in its own row b, traced by the reorder `order` [B] and the lineage [B'', t-1]
        (hypothesis b's position s is in row lineage[order[b], s]): nothing copied. -> (o [B, H, 1, D], or None
        where the storages have no room and nothing ran; the next lineage [B, t] where traced, else None; keys and
        writes, views of t positions)."""
        phi = block.phi
        return self.kernel.raw_lazy_step(q, k, v, block.rule.kernel_scalars(*scalars)[0], keys, writes, decay,
                                         KERNEL_MAPS[phi.kernel_map], phi.kernel_nu, _projection(phi, q), order,
                                         lineage, KERNEL_NORMS[block.norm], PHI_EPS, block.rule.z_column, Z_EPS)

    def source_read(self, block, q: Tensor, source: Tensor) -> Tensor:
        """The cross-attention's read o [B, H, 1, D] of a cached source (source_memory.py: [R, H, S, E + M] or
        [R, H, E, M]; hypothesis b reads row b / (B / R)) from the raw query rows q [B, H, 1, d]
        (csrc/cpu/source_read.cpp), the z column divided out where the rule has one."""
        phi = block.phi
        return self.kernel.raw_source_read(q, source, KERNEL_MAPS[phi.kernel_map], phi.kernel_nu,
                                           _projection(phi, q), KERNEL_NORMS[block.norm], PHI_EPS,
                                           block.rule.z_column, Z_EPS)


def _projection(phi, q: Tensor) -> Optional[Tensor]:
    """The map's projection (FAVOR+'s R [m, d], a float32 buffer) in q's dtype, which the kernels compute in."""
    projection = phi.kernel_projection
    return None if projection is None else projection.to(q.dtype)


TORCH = TorchBackend()


@lru_cache(maxsize=None)
def _kernel_backend(kernel) -> KernelBackend:
    return KernelBackend(kernel)  # one per extension: a step makes no object


def backend(block, q: Tensor, cached: Optional[Tensor] = None):
    """The backend of a step of `block` (a Block) from heads like q, over the cached tensor `cached` (None: none
    yet): the kernels where they take it (module docstring), else TORCH."""
    if block.rule.kernel_scalars is None or block.phi.kernel_map is None:
        return TORCH
    kernel = cpu_kernel(q)
    if not kernel or (cached is not None and cached.dtype != q.dtype):
        return TORCH
    return _kernel_backend(kernel)
