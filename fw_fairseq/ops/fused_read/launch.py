"""What every fused read's launch needs, decided once for both rules: the map's numbers (MapSpec), the block shapes,
the products' precision and the accumulators' dtype (meta), the sizes and strides every kernel takes, its grid, and
the checks of the inputs (checked_heads: one line naming the argument, common/checks.py).

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

from fw_fairseq.ops.common.checks import FLOAT_DTYPES, check_tensor
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


def checked_heads(spec, q, k, v, scalars, causal):
    """The raw heads q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M] with their rows contiguous (rowwise), once
    they and the per-position scalars ({name: [B, H, T]}) are checked: a ValueError of one line naming the
    argument. d is the map's (spec.d); on CUDA the compiled kernels' dtypes (CUDA_DTYPES)."""
    fn = "fused_read"
    dtypes = CUDA_DTYPES if isinstance(q, torch.Tensor) and q.is_cuda else FLOAT_DTYPES
    check_tensor(fn, "q", q, "[B, H, Tq, d]", sizes=(None, None, None, spec.d), dtypes=dtypes)
    B, H, Tq, d = q.shape
    check_tensor(fn, "k", k, "[B, H, T, d]", sizes=(B, H, None, d), like=("q", q), dtypes=dtypes)
    T = k.shape[2]
    check_tensor(fn, "v", v, "[B, H, T, M]", sizes=(B, H, T, None), like=("q", q), dtypes=dtypes)
    for name, x in scalars.items():
        check_tensor(fn, name, x, "[B, H, T]", sizes=(B, H, T), like=("q", q), dtypes=dtypes)
    M = v.shape[-1]
    if causal and Tq != T:
        raise ValueError(f"{fn}: a causal read needs as many queries as keys, got Tq={Tq}, T={T}")
    if not (1 <= Tq <= MAX_T and 1 <= T <= MAX_T):
        raise ValueError(f"{fn}: Tq={Tq}, T={T}; the fused read takes 1..{MAX_T} positions")
    if d > MAX_D or M > MAX_D:
        raise ValueError(f"{fn}: d={d}, M={M}; the fused read takes heads and values of at most {MAX_D}")
    return tuple(rowwise(x) for x in (q, k, v))


def strides(*tensors):
    """The batch, head and row strides of each tensor [B, H, rows, ...], in order: the kernels' pointer arithmetic
    (entries contiguous: rowwise)."""
    return [s for x in tensors for s in x.stride()[:3]]


def sizes(spec, q, k, v):
    """The sizes every kernel takes after its pointers: H, Tq, T, d, E, m, M."""
    return (q.shape[1], q.shape[2], k.shape[2], q.shape[3], spec.E, spec.m, v.shape[-1])


def meta(spec, q, k, v, **flags):
    """The kernels' meta-parameters: the rule's `flags`, the map's (MAP, DB, EC), the values' block MB, the
    positions per block BT, the products' precision PREC and the accumulators' dtype ACC."""
    prec, acc = precision(q.dtype)
    return dict(flags, MAP=spec.code, DB=spec.db, MB=max(16, triton.next_power_of_2(v.shape[-1])), EC=spec.ec,
                BT=block_t(max(q.shape[2], k.shape[2])), PREC=prec, ACC=acc, num_stages=NUM_STAGES)


def grid(q, kernel_meta, n=None):
    """The programs: one per head (B H), times one per block of n positions (kernel_meta's BT) where n is given."""
    heads = q.shape[0] * q.shape[1]
    return (heads,) if n is None else (heads, triton.cdiv(n, kernel_meta["BT"]))


def rowwise(x):
    """x with its last dim contiguous (the kernels' row loads), a view where it already is."""
    return x if x.stride(-1) == 1 else x.contiguous()
