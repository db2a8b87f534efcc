"""What the decoder self-attention's lazy cache (decoder_state.py) keeps of a key, per feature map, and how it scores
rows against what it keeps.

The cache reads sum_s (phi(q) . phi(k_s)) u_s. By default it keeps phi(k_s) (C = E wide) and scores rows by one
matmul. DPFP keeps the raw d-wide key instead (C = d, not 2 d nu): its phi is products of the key's own entries, which
its CPU kernels form in registers while they score (dpfp_function.dpfp_scores, csrc/cpu/lazy_step.cpp). Recomputing
phi cost about what reading it from a cached phi cost, and the cache a step reads and a reorder copies is 2.5 times
smaller (fw_fairseq/ops/README.md §6). Where phi of keys is normalised (the delta rules), phi(k_s) =
c_s phi_raw(k_s), and a raw-key cache keeps the writes times c_s: the products are the same.

`key_cache(phi)` looks the map up by its type in KEY_CACHES, as fast-transformers' feature-map factory builds a map
from a table; a map not there keeps its features.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from fw_fairseq.ops import phi_scale
from fw_fairseq.ops.common.guards import records
from fw_fairseq.ops.maps.dpfp_function import dpfp_scores
from fw_fairseq.ops.maps.feature_maps import Dpfp


class FeatureKeys:
    """A cache of the keys' features themselves (C = E), whatever the map."""

    def __init__(self, phi=None):
        self.phi = phi  # only `width` asks it: a cache of given features (phi None) needs no map

    @property
    def width(self) -> int:
        """C, the width of a cached key."""
        return self.phi.out_dim

    def row(self, x: Tensor, phi_k: Tensor) -> Tensor:
        """What the cache keeps of keys x [..., d] whose features, as the attention uses them, are phi_k [..., E]."""
        return phi_k

    def features(self, cached: Tensor) -> Tensor:
        """phi [..., E] of cached rows [..., C], unnormalised."""
        return cached

    def scores(self, rows: Tensor, cached: Tensor) -> Tensor:
        """rows [B, H, R, E] . phi(cached [B, H, t, C]) -> [B, H, R, t]."""
        return rows @ cached.transpose(-1, -2)

    def kept_write(self, u: Tensor, key: Tensor, norm: Optional[str]) -> Tensor:
        """The write u [B, H, 1, M] as the cache keeps it beside its row `key` [B, H, 1, C]: the features are kept as
        the attention uses them, normalised already."""
        return u

    def kernel_args(self, norm: Optional[str]) -> Tuple[int, Optional[str]]:
        """(nu, norm) of the lazy-step kernel (csrc/cpu/lazy_step.cpp): nu 0 reads the rows as features, whose writes
        are kept unscaled."""
        return 0, None


class DpfpKeys(FeatureKeys):
    """DPFP's cache of the raw keys (C = d), scored by its kernel without autograd."""

    @property
    def width(self) -> int:
        return self.phi.d_key

    def row(self, x: Tensor, phi_k: Tensor) -> Tensor:
        return x

    def features(self, cached: Tensor) -> Tensor:
        return self.phi(cached, is_query=False)

    def scores(self, rows: Tensor, cached: Tensor) -> Tensor:
        # the kernel has no backward, nor does torch.compile trace it: the product with the features there
        if torch.compiler.is_compiling() or records(rows, cached):
            return rows @ self.features(cached).transpose(-1, -2)
        return dpfp_scores(rows, cached, self.phi.nu)

    def kept_write(self, u: Tensor, key: Tensor, norm: Optional[str]) -> Tensor:
        return u if norm is None else u * phi_scale(self.features(key), norm)  # [B, H, 1, 1]: c of the key

    def kernel_args(self, norm: Optional[str]) -> Tuple[int, Optional[str]]:
        return self.phi.nu, norm  # the kernel forms phi of the raw keys and scales the write by its norm


KEY_CACHES = {Dpfp: DpfpKeys}  # map type -> its cache; the maps not named keep their features
FEATURES = FeatureKeys()  # a cache of given features, with no map behind them


def key_cache(phi) -> FeatureKeys:
    """What a lazy cache keeps of the keys of FeatureMap `phi`."""
    return KEY_CACHES.get(type(phi), FeatureKeys)(phi)
