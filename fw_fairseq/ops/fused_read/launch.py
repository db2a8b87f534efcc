"""What every fused read's launch needs, decided once: the map's numbers (MapSpec), the block shapes, the
products' precision and the accumulators' dtype, and the checks of the inputs (one line naming the argument).

Block shapes are fixed, not autotuned (GPU time goes to measuring, and a kernel compiled once per shape class
is warm after the first batch): positions in blocks of BLOCK_T (fewer for short sequences: a block never spans
more than the next power of two of T), feature columns in chunks of CHUNK_E (Hedgehog's whole row in one
chunk: its two softmaxes' backward sums over a half).
"""
from dataclasses import dataclass
from typing import Optional

import torch
import triton
import triton.language as tl

from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS

MAX_T = 256  # the longest sequence a fused read takes; longer ones chunk through the rule's state
MAX_E = 512  # the widest phi (DPFP-2 of d = 128, DPFP-4 of d = 64, FAVOR+ m = 256)
MAX_D = 256  # the widest head (and value) row
BLOCK_T = 64
CHUNK_E = 64
# The loops' loads feed products through phi formed in registers: buffering them for the next iterations (Triton's
# software pipelining) only multiplies shared memory. The delta rule's dk kernel, d = M = 128, on sm_90: 296 KB with
# 3 stages (over the H100's 227 KB), 160 KB with 1.
NUM_STAGES = 1
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
# Compiled for CUDA the kernels take these; float64 runs only under Triton's interpreter (the parity tests): Triton
# 3.6's float64 products failed to compile for the sum rule's non-causal reads on an H200 ("fp64 don't support
# largeK MMA"), and float64 on CUDA goes to the column kernels anyway (dispatch.py)
CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class MapSpec:
    """A feature map as the kernels take it: code (KERNEL_MAPS), head width d, feature width E, DPFP's nu,
    FAVOR+'s m and R [m, d] (float32 buffer; None for the other maps)."""

    code: int
    d: int
    E: int
    nu: int
    m: int
    projection: Optional[torch.Tensor]

    @property
    def db(self):
        """The head row's block width: a power of two >= d (tl.dot needs >= 16)."""
        return max(16, triton.next_power_of_2(self.d))

    @property
    def ec(self):
        """The chunk of feature columns formed at once."""
        if self.code == KERNEL_MAPS["hedgehog"]:
            return max(16, triton.next_power_of_2(self.E))
        return min(CHUNK_E, max(16, triton.next_power_of_2(self.E)))

    def proj(self, like):
        """FAVOR+'s R in the heads' compute dtype (fp64 for fp64 heads, else fp32), or a 1-element stand-in."""
        dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
        if self.projection is None:
            return torch.zeros(1, dtype=dtype, device=like.device)
        return self.projection.to(device=like.device, dtype=dtype).contiguous()


def map_spec(phi):
    """The MapSpec of a FeatureMap (feature_maps.py), or None where it has no row form."""
    if phi.kernel_map is None:
        return None
    projection = phi.kernel_projection
    m = projection.shape[0] if projection is not None else 1
    return MapSpec(KERNEL_MAPS[phi.kernel_map], phi.d_key, phi.out_dim, phi.kernel_nu, m, projection)


def block_t(T):
    """Positions per block for sequences of T positions."""
    return min(BLOCK_T, max(16, triton.next_power_of_2(T)))


def precision(dtype):
    """(the products' input_precision, the accumulators' tl dtype) for heads of `dtype`: fp32 and fp64 exact
    ("ieee"), fp16/bf16 heads on tensor cores through tf32 products of their fp32 features."""
    if dtype == torch.float64:
        return "ieee", tl.float64
    return ("ieee" if dtype == torch.float32 else "tf32"), tl.float32


def check_heads(fn, q, k, v, scalars, causal):
    """Validate the raw heads q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M] and the per-position scalars
    ([B, H, T] each); raise ValueError with one line naming the argument."""
    for name, x in (("q", q), ("k", k), ("v", v), *scalars.items()):
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"{fn}: {name} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in _DTYPES:
            raise ValueError(f"{fn}: {name} has dtype {x.dtype}; allowed: float16, bfloat16, float32, float64")
        if x.is_cuda and x.dtype not in CUDA_DTYPES:
            raise ValueError(f"{fn}: {name} is {x.dtype} on CUDA; the compiled kernels take float16, bfloat16, "
                             "float32 (float64 reads run on the column kernels)")
        if x.device != q.device:
            raise ValueError(f"{fn}: {name} is on {x.device} but q is on {q.device}; all inputs must share a device")
        rank = 3 if name in scalars else 4
        if x.dim() != rank:
            raise ValueError(f"{fn}: {name} has shape {tuple(x.shape)}, expected rank {rank}")
    B, H, Tq, d = q.shape
    T, M = k.shape[2], v.shape[-1]
    if k.shape != (B, H, T, d) or v.shape[:3] != (B, H, T):
        raise ValueError(f"{fn}: k {tuple(k.shape)} and v {tuple(v.shape)} do not match q {tuple(q.shape)}: "
                         "expected k [B, H, T, d], v [B, H, T, M]")
    for name, x in scalars.items():
        if x.shape != (B, H, T):
            raise ValueError(f"{fn}: {name} has shape {tuple(x.shape)}, expected [B, H, T] = [{B}, {H}, {T}]")
    if causal and Tq != T:
        raise ValueError(f"{fn}: a causal read needs as many queries as keys, got Tq={Tq}, T={T}")
    if not (1 <= Tq <= MAX_T and 1 <= T <= MAX_T):
        raise ValueError(f"{fn}: Tq={Tq}, T={T}; the fused read takes 1..{MAX_T} positions")
    if d > MAX_D or M > MAX_D:
        raise ValueError(f"{fn}: d={d}, M={M}; the fused read takes heads and values of at most {MAX_D}")


def rowwise(x):
    """x with its last dim contiguous (the kernels' row loads), a view where it already is."""
    return x if x.stride(-1) == 1 else x.contiguous()
