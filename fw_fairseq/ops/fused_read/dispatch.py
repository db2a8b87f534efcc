"""When the fused read runs, decided once (fused_read_for), and the read of a block it takes (read); the public
entry point by a rule's name is rules/public.py's fused_read.

The fused read takes a block where all of these hold: the heads are on a device of DEVICES (CUDA; the tests add
the CPU under Triton's interpreter), Triton imports, the dtype is one the device's kernels take (fp16, bf16, fp32 on
CUDA: float64 stays on the column kernels and the chunked path), phi has a row form no wider than launch.MAX_E, the
rule has a fused form, and T is within the crossover of CROSSOVER for the mode.

CROSSOVER is the longest T at which the fused read is the faster path, per mode (every rule's). Its entries are the
kernel's own limit (launch.MAX_T) for every mode: the fused read recomputes phi per tile where the column kernels
walk T step by step, so it wins at every length it takes by its operation count; benchmarks/bench_fused_read_gpu.py
prints both paths side by side for the GPU at hand, and an entry comes down where it measures the column kernels
faster.
"""
import torch

from fw_fairseq.ops.maps.normalize_function import PHI_NORMS
from fw_fairseq.ops.fused_read.available import kernels

DEVICES = ("cuda",)
CUDA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MODES = ("causal", "encoder", "cross")
CROSSOVER = {mode: 256 for mode in MODES}


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
    launch = kernels()
    spec = launch.map_spec(phi)
    Tq, T = q.shape[2], k.shape[2]
    limit = CROSSOVER[_mode(causal, Tq, T)]
    if spec is None or spec.E > launch.MAX_E or max(Tq, T) > limit or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    return read(spec, rule, q, k, v, scalars, causal, norm, key_padding_mask)


def read(spec, rule, q, k, v, scalars, causal, norm, key_padding_mask):
    launch = kernels()
    launch.check_heads("fused_read", q, k, v, dict(zip(rule.scalars, scalars)), causal)
    if rule.normalised_phi and norm not in PHI_NORMS:
        raise ValueError(f"fused_read: norm={norm!r} is not allowed for rule {rule.name}; allowed: {tuple(PHI_NORMS)}")
    q, k, v = (launch.rowwise(x) for x in (q, k, v))
    return rule.fused(spec, q, k, v, scalars, causal, norm, key_padding_mask)
