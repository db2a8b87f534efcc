"""When the fused read runs, decided once (fused_read_for), and its public entry point (fused_read).

The fused read takes a block where all of these hold: the heads are on a device of DEVICES (CUDA; the tests add
the CPU under Triton's interpreter), Triton imports, the dtype is one the device's kernels take (fp16, bf16, fp32 on
CUDA: float64 stays on the column kernels and the chunked path), phi has a row form no wider than launch.MAX_E, the
rule has a fused form, and T is within the crossover of CROSSOVER for the rule and mode.

CROSSOVER is the longest T at which the fused read is the faster path, per (rule, mode). Its entries are the
kernel's own limit (launch.MAX_T) for every mode: the fused read recomputes phi per tile where the column kernels
walk T step by step, so it wins at every length it takes by its operation count; benchmarks/bench_fused_read_gpu.py
prints both paths side by side for the GPU at hand, and an entry comes down where it measures the column kernels
faster.
"""
import torch

from ..normalize_function import PHI_NORMS
from ..rules import RULES
from .forms import kernels

DEVICES = ("cuda",)
CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MODES = ("causal", "encoder", "cross")
CROSSOVER = {(rule, mode): 256 for rule in RULES for mode in MODES}


def takes(q):
    """Whether heads like q go to the fused read at all (device, dtype, Triton): the module asks before it picks
    the heads' dtype."""
    if q.device.type not in DEVICES or torch.compiler.is_compiling():
        return False
    if q.is_cuda and q.dtype not in CUDA_DTYPES:
        return False
    return bool(kernels())


def _mode(causal, Tq, T):
    return MODES[0] if causal else MODES[1] if Tq == T else MODES[2]


def fused_read_for(phi, rule, q, k, v, scalars, causal, norm, key_padding_mask):
    """The fused read's o [B, H, Tq, M] where it takes this block (module docstring), else None; rule: an UpdateRule."""
    if rule.fused is None or not takes(q):
        return None
    launch = kernels()[0]
    spec = launch.map_spec(phi)
    Tq, T = q.shape[2], k.shape[2]
    limit = CROSSOVER.get((rule.name, _mode(causal, Tq, T)), 0)
    if spec is None or spec.E > launch.MAX_E or max(Tq, T) > limit or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    return _read(spec, rule, q, k, v, scalars, causal, norm, key_padding_mask)


def fused_read(phi, rule, q, k, v, scalars, causal, norm=None, key_padding_mask=None):
    """o [B, H, Tq, M] (module docstring); rule: a RULES name. Raises ValueError, one line naming the argument, on
    what it cannot take: shapes, dtypes, devices, T beyond launch.MAX_T, a map without a row form, a rule without a
    fused form."""
    if not kernels():
        raise ValueError("fused_read: Triton is not available on this machine")
    if rule not in RULES or RULES[rule].fused is None:
        raise ValueError(f"fused_read: rule={rule!r} has no fused form; allowed: "
                         f"{', '.join(name for name, r in RULES.items() if r.fused is not None)}")
    launch = kernels()[0]
    spec = launch.map_spec(phi)
    if spec is None:
        raise ValueError(f"fused_read: phi={type(phi).__name__} has no row form; allowed: DPFP, ELU+1, Hedgehog, FAVOR+")
    if spec.E > launch.MAX_E:
        raise ValueError(f"fused_read: phi is {spec.E} wide; the fused read takes E <= {launch.MAX_E}")
    if not isinstance(scalars, (tuple, list)) or len(scalars) != len(RULES[rule].scalars):
        raise ValueError(f"fused_read: scalars must be a tuple of {len(RULES[rule].scalars)} [B, H, T] tensors "
                         f"{RULES[rule].scalars} for rule {rule}")
    return _read(spec, RULES[rule], q, k, v, tuple(scalars), causal, norm, key_padding_mask)


def _read(spec, rule, q, k, v, scalars, causal, norm, key_padding_mask):
    launch = kernels()[0]
    launch.check_heads("fused_read", q, k, v, dict(zip(rule.scalars, scalars)), causal)
    if rule.normalised_phi and norm not in PHI_NORMS:
        raise ValueError(f"fused_read: norm={norm!r} is not allowed for rule {rule.name}; allowed: {tuple(PHI_NORMS)}")
    q, k, v = (launch.rowwise(x) for x in (q, k, v))
    return rule.fused(spec, q, k, v, scalars, causal, norm, key_padding_mask)
