"""The fused read's benchmark cases (fw_research.benchmarks.bench_fused_read_gpu): their shapes and dtypes, their
inputs, the reads of each rule, and the error they are judged by (rel_err, which the parity tests on a GPU use too).
fw_research.gpu_node.gpu_triton_cache compiles the fused read's kernels for the same launches, so the cache it makes is
the one the benchmark hits.
"""
import torch

from fw_fairseq.ops import RULES

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
# name -> batch B, heads H, length T, head width d (= value width M), DPFP's nu (E = 2 d nu), dtype
CASES = {
    "mt": dict(B=125, H=16, T=32, d=64, nu=2, dtype="bf16"),  # a translation batch: B H = 2000, DPFP-2 (E = 256)
    "t256": dict(B=16, H=16, T=256, d=64, nu=2, dtype="bf16"),  # the fused read's longest sequence, B H = 256
    "mt_fp32": dict(B=125, H=16, T=32, d=64, nu=2, dtype="fp32"),  # fla's chunked kernel refuses fp32
    "mt_e512": dict(B=125, H=16, T=32, d=64, nu=4, dtype="bf16"),  # DPFP-4: E = 512, past fla's chunked limit
    "t64": dict(B=64, H=16, T=64, d=64, nu=2, dtype="bf16"),
    "t128": dict(B=32, H=16, T=128, d=64, nu=2, dtype="bf16"),
    "t256_e512": dict(B=16, H=16, T=256, d=64, nu=4, dtype="bf16"),
    "tiny": dict(B=1, H=2, T=8, d=8, nu=2, dtype="fp64"),  # the CPU smoke run (under TRITON_INTERPRET=1)
}
QUICK = ["mt", "t256", "mt_fp32", "mt_e512"]
RULE_CASES = [("sum", False), ("sum", True), ("delta", True)]
NORM = {"sum": None, "delta": "l2"}


def seq_first(x):
    """[B, H, T, *] or [B, H, T] -> fla's [B, T, H, *] or [B, T, H]."""
    return x.transpose(1, 2).contiguous()


def make_inputs(case, device, seed=0):
    """Head-first float32 leaves' values: q, k, v [B, H, T, d], beta [B, H, T] in (0, 1)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    shape = (case["B"], case["H"], case["T"], case["d"])
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    beta = torch.sigmoid(torch.randn(shape[:3], generator=g))
    return [x.to(device) for x in (q, k, v, beta)]


def leaves(values, rule, layout, dtype):
    """The method's inputs (requiring grad) in its layout and dtype: q, k, v and the rule's scalars."""
    xs = values[:3] + values[3:3 + len(RULES[rule].scalars)]
    return [in_layout(x, layout).to(dtype).detach().requires_grad_() for x in xs]


def in_layout(x, layout):
    """A head-first [B, H, T, *] or [B, H, T] tensor in a method's layout."""
    return seq_first(x) if layout == "seq" else x


def rel_err(x, ref):
    """max |x - ref| / max |ref|; 1.0 (all of it wrong) for a gradient the method did not give."""
    if x is None:
        return 1.0
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
