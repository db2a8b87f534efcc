"""FastWeightAttention's sum-rule read from the raw heads (FeatureMap.sum_read: DPFP on the CPU kernel, which the
module takes where the rule reads in the order (q k^T) v) is the same function as forming phi and running the rule:
outputs and every gradient (parameters and inputs) in float64 on each path, with padding, in training mode, and
where the order is not short (no sum_read: the rule runs)."""
import pytest
import torch

from fw_fairseq.modules import FastWeightAttention, FastWeightConfig
from fw_fairseq.ops import SUM_CHUNK_SIZE
from fw_fairseq.ops.cpu_extension import cpu_kernel
from fw_fairseq.ops.feature_maps import Dpfp, FeatureMap

C, H = 16, 2  # d_key 8
FUSED_READ = Dpfp.sum_read
PATHS = {"encoder": dict(causal=False), "causal": dict(causal=True),
         "cross": dict(causal=False, kdim=10, vdim=10, encoder_decoder_attention=True)}


def run(path, T, S, fused, monkeypatch, seed=3):
    """(output, gradients of the parameters and of query and key, whether the fused read ran) of one training call."""
    ran = []
    if fused:
        def spy(self, *args):
            ran.append(FUSED_READ(self, *args))
            return ran[-1]
        monkeypatch.setattr(Dpfp, "sum_read", spy)
    else:
        monkeypatch.setattr(Dpfp, "sum_read", FeatureMap.sum_read)
    torch.manual_seed(0)
    attn = FastWeightAttention(C, H, FastWeightConfig("dpfp", "sum", 2, 8, frozenset(), 1, encoder_conv=3),
                               **PATHS[path]).double().train()
    g = torch.Generator().manual_seed(seed)
    B = 3
    query = torch.randn(T, B, C, generator=g, dtype=torch.float64, requires_grad=True)
    key = query if path != "cross" else torch.randn(S, B, 10, generator=g, dtype=torch.float64, requires_grad=True)
    pad = None
    if path != "causal":
        pad = torch.zeros(B, key.size(0), dtype=torch.bool)
        pad[1, :3], pad[2, :1] = True, True  # fairseq pads sources on the left
    out, _ = attn(query, key, key, key_padding_mask=pad)
    upstream = torch.randn(out.shape, generator=g, dtype=torch.float64)
    inputs = [query] + ([key] if key is not query else [])
    grads = torch.autograd.grad(out, [*attn.parameters(), *inputs], upstream)
    monkeypatch.undo()
    return out, grads, any(y is not None for y in ran)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("T,S", [(6, 9), (SUM_CHUNK_SIZE + 3, 80)])
def test_the_fused_read_is_the_rules_function(path, T, S, monkeypatch):
    if cpu_kernel(torch.zeros(1, dtype=torch.float64)) is None:
        pytest.skip("fw_fairseq._cpu is not built")
    out, grads, fused = run(path, T, S, True, monkeypatch)
    assert fused == (T <= SUM_CHUNK_SIZE)  # the short sentences read through the kernel, the long ones not
    ref_out, ref_grads, _ = run(path, T, S, False, monkeypatch)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-11)
