"""When the fused read runs, decided once (fused_read_for), and the read of a block it takes (read); the public
entry point by a rule's name is rules/public.py's fused_read.

The fused read takes a block where all of these hold: the heads are on a device of DEVICES (CUDA; the tests add
the CPU under Triton's interpreter), Triton imports, the dtype is one the device's kernels take (fp16, bf16, fp32 on
CUDA: float64 stays on the column kernels and the chunked path), phi has a row form no wider than launch.MAX_E, the
rule has a fused form, and E and T are within the mode's entry of CROSSOVER.

CROSSOVER holds, per mode (every rule's), the widest phi and the longest T at which the fused read is the faster
path; past either a block takes the column kernels (causal) or the state form (non-causal). The entries come from
benchmarks/results/gpu_h200_2026-11-27 (bench_fused_read_gpu.py on an H200, bf16, fwd+bwd, d = 64; the fused read
against the path it replaces):
- causal: faster at T = 32 (sum 2.29x, delta 2.08x at E = 256; 2.24x, 2.12x at E = 512), slower at T = 256 (0.86x,
  0.82x). Between the two measured lengths the ratio, interpolated in log T, crosses 1 at T = 164 (delta) to 186
  (sum): the entry is the power of two below, 128.
- non-causal (encoder): faster at T = 32, E = 256 (1.55x), slower at T = 32, E = 512 (0.74x) and at T = 256 (0.34x):
  here the state form costs T E M against the fused read's T^2 E, so the crossing comes early (T = 58 interpolated)
  and the entry is 32, for phi up to E = 256.
- cross: not measured apart; the same non-causal kernels as the encoder's, so the encoder's entry.
- aligned (the aligned cross-attention, --fw-cross-align; fused_aligned_read_for): not measured on a GPU. The path it
  replaces is the short order in PyTorch ops, not the state form (whose features are 2P + 1 times wider): the same
  Tq T E products, with phi and the scores in memory. So the entry is the kernels' own limit, launch.MAX_T.
bench_fused_read_gpu.py prints both paths side by side for the GPU at hand; an entry moves where it measures them.
"""
import torch

from fw_fairseq.ops.maps.normalize_function import PHI_NORMS
from fw_fairseq.ops.fused_read.available import kernels

DEVICES = ("cuda",)
MODES = ("causal", "encoder", "cross", "aligned")
# mode -> (widest E, longest T)
CROSSOVER = {"causal": (512, 128), "encoder": (256, 32), "cross": (256, 32), "aligned": (256, 256)}


def takes(q):
    """Whether heads like q go to the fused read at all (device, dtype, Triton): the module asks before it picks
    the heads' dtype."""
    if q.device.type not in DEVICES or torch.compiler.is_compiling():
        return False
    launch = kernels()
    return bool(launch) and (not q.is_cuda or q.dtype in launch.CUDA_DTYPES)


def _mode(causal, Tq, T):
    return MODES[0] if causal else MODES[1] if Tq == T else MODES[2]


def _spec_within(phi, q, k, v, mode):
    """phi's MapSpec where the fused read takes heads like q, k, v in `mode` (a row form, one dtype, E and T within
    the mode's CROSSOVER entry), else None."""
    launch = kernels()
    spec = launch.map_spec(phi)
    if spec is None or k.dtype != q.dtype or v.dtype != q.dtype:
        return None
    widest, longest = CROSSOVER[mode]
    if spec.E > min(widest, launch.MAX_E) or max(q.shape[2], k.shape[2]) > longest:
        return None
    return spec


def fused_read_for(phi, rule, q, k, v, scalars, causal, norm, key_padding_mask):
    """The fused read's o [B, H, Tq, M] where it takes this block (module docstring), else None; rule: an UpdateRule."""
    if rule.fused is None or not takes(q):
        return None
    spec = _spec_within(phi, q, k, v, _mode(causal, q.shape[2], k.shape[2]))
    return None if spec is None else read(spec, rule, q, k, v, scalars, causal, norm, key_padding_mask)


def fused_aligned_read_for(phi, rule, order, angles, q, k, v, key_padding_mask):
    """The aligned cross-attention's fused read o [B, H, Tq, M] (the rule's fused_aligned: the scores weighed by
    cos^(2 order)((a_i - b_j) / 2) of angles (a [B, Tq], b [B, T])) where it takes this block, else None."""
    if rule.fused_aligned is None or not takes(q):
        return None
    spec = _spec_within(phi, q, k, v, "aligned")
    if spec is None:
        return None
    q, k, v = kernels().checked_heads(spec, q, k, v, {}, False)
    return rule.fused_aligned(spec, q, k, v, order, angles, key_padding_mask)


def read(spec, rule, q, k, v, scalars, causal, norm, key_padding_mask):
    """The rule's fused read o [B, H, Tq, M] of a block it takes, its inputs checked here once (launch.checked_heads;
    the rules' fused forms take them as checked)."""
    q, k, v = kernels().checked_heads(spec, q, k, v, dict(zip(rule.scalars, scalars)), causal)
    if rule.normalised_phi and norm not in PHI_NORMS:
        raise ValueError(f"fused_read: norm={norm!r} is not allowed for rule {rule.name}; allowed: {tuple(PHI_NORMS)}")
    return rule.fused(spec, q, k, v, scalars, causal, norm, key_padding_mask)
