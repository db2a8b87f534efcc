"""Feature maps phi: R^d -> R^E_{>=0} that linearise attention (paper §5), and their normalisations.

All maps act on the last dimension and keep every leading dimension, e.g. [B, H, T, d] -> [B, H, T, E]; the
learned maps (learned.py: T2R, trainable Hedgehog) hold per-head parameters and take [..., H, T, d].
Each map is a FeatureMap object (fast-transformers' feature_maps/base.py is the pattern), called the
same way whatever the map: `phi(x, is_query)`, `phi.out_dim` (E), `phi.redraw()` (a no-op except for
FAVOR+'s random features); `feature_map(name, d_key, nu, m)` (factory.py) builds one from the flags' values and
checks its arguments. The plain functions elu_plus_one and dpfp are the maps' maths. A map is its maths
only: the reads from raw heads (ops/rules/raw_read.py) and what a decoding cache keeps of a key
(fw_fairseq/decoding/key_cache.py) look the map up by its row form (kernel_map) or its type.
"""
import abc

import torch
import torch.nn.functional as F
from torch import nn

from fw_fairseq.ops.maps.dpfp_function import DpfpFunction, dpfp_forward
from fw_fairseq.ops.maps.favor_function import FavorFunction, favor_forward, favor_plus, orthogonal_gaussian
from fw_fairseq.ops.common.guards import eager_form, state_dtype
from fw_fairseq.ops.maps.normalize_function import PHI_NORMS


def elu_plus_one(x):
    """Linear Transformer map (Katharopoulos et al., 2020): phi(x) = elu(x) + 1 > 0, E = d."""
    return F.elu(x) + 1.0


def dpfp(x, nu):
    """Deterministic parameter-free projection DPFP-nu (paper Eq. 37, Appendix C), E = 2 d nu.

    r = [relu(x), relu(-x)] (2d wide); phi = concat_{i=1..nu} r * roll(r, i).
    nu must be an int in 1..2d-1: roll by 0 or by 2d would square r instead of pairing distinct
    partial functions, and the paper's capacity argument needs distinct pairs.
    """
    _check_nu(nu, x.shape[-1])
    r = torch.cat([F.relu(x), F.relu(-x)], dim=-1)  # [..., 2d]
    return torch.cat([r * r.roll(shifts=i, dims=-1) for i in range(1, nu + 1)], dim=-1)  # [..., 2d*nu]


def _check_nu(nu, d):
    if isinstance(nu, bool) or not isinstance(nu, int) or not 1 <= nu <= 2 * d - 1:
        raise ValueError(f"dpfp: nu={nu!r} is not allowed; nu must be an int in 1..{2 * d - 1} (2*d-1 for d={d})")


class FeatureMap(nn.Module, abc.ABC):
    """phi: [..., d_key] -> [..., out_dim]. A module, so that a map with state (FAVOR+'s random
    projection) lives in its owner's state dict; the parameter-free maps add nothing to it."""

    def __init__(self, d_key):
        super().__init__()
        if isinstance(d_key, bool) or not isinstance(d_key, int) or d_key < 1:
            raise ValueError(f"{type(self).__name__}: d_key={d_key!r} is not allowed; it must be an int >= 1")
        self.d_key = d_key

    @property
    @abc.abstractmethod
    def out_dim(self):
        """E, the width of phi(x): the capacity of the fast weight memory (paper §4.1)."""

    def redraw(self):
        """Draw new random features (once per training forward, by the owner); deterministic maps have none."""

    @abc.abstractmethod
    def forward(self, x, is_query):
        """x [..., d_key] -> phi(x) [..., out_dim]; is_query matters only to maps that treat queries apart."""

    def normalized(self, x, is_query, kind):
        """phi(x) normalised by --fw-delta-norm's `kind` ("sum" or "l2", PHI_NORMS)."""
        return PHI_NORMS[kind](self(x, is_query))

    # The map's row form in the CPU kernels and the fused GPU read (cpu_extension.KERNEL_MAPS' name, None where it
    # has none), the nu it takes (DPFP's; 0 for the others) and its projection (FAVOR+'s R; None for the others):
    # the arguments with which those kernels form phi of raw rows themselves
    kernel_map = None
    kernel_nu = 0
    kernel_projection = None


class EluPlusOne(FeatureMap):
    """phi(x) = elu(x) + 1 (Katharopoulos et al., 2020), E = d_key."""

    kernel_map = "elu"

    @property
    def out_dim(self):
        return self.d_key

    def forward(self, x, is_query):
        return elu_plus_one(x)


def _normalized_dpfp(x, nu, norm):
    """PHI_NORMS[norm](dpfp(x, nu)) as plain ops: the formula DpfpFunction with a norm computes."""
    return PHI_NORMS[norm](dpfp(x, nu))


class Dpfp(FeatureMap):
    """DPFP-nu (paper Eq. 37), E = 2 d_key nu; nu is checked here, when the map is built."""

    def __init__(self, d_key, nu):
        super().__init__(d_key)
        _check_nu(nu, d_key)
        self.nu = nu

    def extra_repr(self):
        return f"d_key={self.d_key}, nu={self.nu}"

    @property
    def out_dim(self):
        return 2 * self.d_key * self.nu

    def forward(self, x, is_query):
        return eager_form(DpfpFunction, dpfp, dpfp_forward, x, self.nu)

    def normalized(self, x, is_query, kind):
        # the map and its normalisation as one Function (one pass each way on the CPU kernel), as the map
        # alone takes its forms
        return eager_form(DpfpFunction, _normalized_dpfp, dpfp_forward, x, self.nu, kind)

    kernel_map = "dpfp"

    @property
    def kernel_nu(self):
        return self.nu


class Hedgehog(FeatureMap):
    """phi(x) = [softmax(x), softmax(-x)] over the key's d entries, E = 2 d (Hedgehog, Zhang et al. 2024).

    exp makes the kernel spiky as softmax attention is: phi(q) . phi(k) grows with the scale of q and k
    that the projections learn, where DPFP's and ELU+1's ratios do not (DPFP is homogeneous: the sum
    rule's phi(q) . phi(k) / z . phi(q) is the same for c q and c k). Hedgehog's trainable d x d layer
    before the softmax is left out by default: the q and k projections before the map are linear already. Each
    softmax is over one key's own entries, so the map is bounded (sum phi = 2) and needs no fp32 guard.
    With --fw-hedgehog-trainable the layer is there (learned.TrainableHedgehog), for converted models.
    """

    kernel_map = "hedgehog"

    @property
    def out_dim(self):
        return 2 * self.d_key

    def forward(self, x, is_query):
        return torch.cat([torch.softmax(x, dim=-1), torch.softmax(-x, dim=-1)], dim=-1)  # [..., 2 d]


class FavorPlus(FeatureMap):
    """FAVOR+ positive random features (Performer), E = 2m, approximating exp(q.k / sqrt(d)).

    phi(x) = [exp(R x' - |x'|^2/2), exp(-R x' - |x'|^2/2)] / sqrt(2m) with x' = x d^-1/4, so that
    E_R[phi(q) . phi(k)] = exp(q'.k') = exp(q.k / sqrt(d)) (the hyperbolic, +/-, estimator).

    Redraw policy: `forward` never redraws. Queries and keys of one layer must see the same R within
    one forward (otherwise phi(q).phi(k) estimates nothing), so the owning attention module calls
    `redraw()` once per training forward, before mapping q and k (the paper's new R per mini-batch);
    in eval R stays fixed. With `fixed`, redraw() keeps the R drawn at construction (--fw-favor-redraw
    never). R is a persistent buffer `projection` [m, head_dim] so a checkpoint reproduces decoding.

    dtype: computed in float32 for fp16/bf16 inputs (exp overflows fp16) and returned as float32;
    float32/float64 inputs are computed and returned in their own dtype.
    """

    def __init__(self, head_dim, num_features, fixed=False):
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
            raise ValueError(f"FavorPlus: head_dim={head_dim!r} is not allowed; it must be an int >= 1")
        super().__init__(head_dim)
        if isinstance(num_features, bool) or not isinstance(num_features, int) or num_features < 1:
            raise ValueError(f"FavorPlus: num_features={num_features!r} is not allowed; it must be an int >= 1")
        self.head_dim, self.num_features, self.fixed = head_dim, num_features, bool(fixed)
        self.register_buffer("projection", orthogonal_gaussian(num_features, head_dim, None, torch.float32))

    def extra_repr(self):
        return f"head_dim={self.head_dim}, num_features={self.num_features}, fixed={self.fixed}"

    @property
    def out_dim(self):
        return 2 * self.num_features

    @torch.no_grad()
    def redraw(self):
        """Draw a fresh R in place (same device and dtype as the current buffer), unless `fixed`."""
        if self.fixed:
            return
        p = self.projection
        p.copy_(orthogonal_gaussian(self.num_features, self.head_dim, p.device, p.dtype))

    kernel_map = "favor"

    @property
    def kernel_projection(self):
        return self.projection

    def forward(self, x, is_query):
        """x: [..., head_dim] -> phi(x): [..., 2m]; `is_query` picks the stabilisation (see below)."""
        if x.shape[-1] != self.head_dim:
            raise ValueError(f"FavorPlus: x has last dim {x.shape[-1]}, expected head_dim={self.head_dim}")
        dtype = state_dtype(x.dtype)
        return eager_form(FavorFunction, favor_plus, lambda t, *args: favor_forward(t, *args)[0],
                           x.to(dtype), self.projection.to(dtype), is_query)
