"""FastWeightAttention's read of a short sequence from the raw heads (raw_read.short_read: DPFP, ELU+1, Hedgehog and
FAVOR+ on the CPU kernel, for the sum rule and the delta rule on each path) is the same function as forming phi and
running the rule:
outputs and every gradient (parameters and inputs) in float64, with padding, in training mode; and where the
sequence is not short (no short read: the rule runs)."""
import pytest
import torch

from fw_fairseq.modules import FastWeightAttention, FastWeightConfig
from fw_fairseq.ops.common.chunking import DELTA_ONE_CHUNK_MAX, SUM_CHUNK_SIZE
from fw_fairseq.ops.kernels.cpu_extension import cpu_kernel
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS
from fw_fairseq.modules import fast_weight_attention

FUSED_READ = fast_weight_attention.short_read
C, H = 16, 2  # d_key 8
PATHS = {"encoder": dict(causal=False), "causal": dict(causal=True),
         "cross": dict(causal=False, kdim=10, vdim=10, encoder_decoder_attention=True)}
CASES = [("sum", "encoder"), ("sum", "causal"), ("sum", "cross"), ("delta", "encoder"), ("delta", "causal"),
         ("delta", "cross")]


def run(name, rule, path, T, S, fused, monkeypatch, seed=3):
    """(output, gradients of the parameters and of query and key, whether the short read ran) of one training call."""
    ran = []
    def spy(phi, *args):
        ran.append(FUSED_READ(phi, *args) if fused else None)
        return ran[-1]
    monkeypatch.setattr(fast_weight_attention, "short_read", spy)
    torch.manual_seed(0)
    config = FastWeightConfig(name, rule, 2, 8, frozenset(), 1, delta_norm="l2", encoder_conv=3)
    attn = FastWeightAttention(C, H, config, **PATHS[path]).double().train()
    g = torch.Generator().manual_seed(seed)
    B = 3
    query = torch.randn(T, B, C, generator=g, dtype=torch.float64, requires_grad=True)
    key = query if path != "cross" else torch.randn(S, B, 10, generator=g, dtype=torch.float64, requires_grad=True)
    pad = torch.zeros(B, key.size(0), dtype=torch.bool)
    if path != "causal":
        pad[1, :3], pad[2, :1] = True, True  # fairseq pads sources on the left
    else:
        pad[1, -2:] = True  # and targets on the right
    out, _ = attn(query, key, key, key_padding_mask=pad)
    upstream = torch.randn(out.shape, generator=g, dtype=torch.float64)
    inputs = [query] + ([key] if key is not query else [])
    grads = torch.autograd.grad(out, [*attn.parameters(), *inputs], upstream)
    monkeypatch.undo()
    return out, grads, any(y is not None for y in ran)


@pytest.mark.parametrize("name", sorted(KERNEL_MAPS))
@pytest.mark.parametrize("rule,path", CASES)
@pytest.mark.parametrize("long", [False, True])
def test_the_short_read_is_the_rules_function(name, rule, path, long, monkeypatch):
    if cpu_kernel(torch.zeros(1, dtype=torch.float64)) is None:
        pytest.skip("fw_fairseq._cpu is not built")
    limit = SUM_CHUNK_SIZE if rule == "sum" else DELTA_ONE_CHUNK_MAX
    T, S = (limit + 3, 80) if long else (6, 9)
    out, grads, fused = run(name, rule, path, T, S, True, monkeypatch)
    assert fused != long  # the short sentences read through the kernel, the long ones not
    ref_out, ref_grads, _ = run(name, rule, path, T, S, False, monkeypatch)
    torch.testing.assert_close(out, ref_out, rtol=1e-10, atol=1e-12)
    for ours, ref in zip(grads, ref_grads):
        torch.testing.assert_close(ours, ref, rtol=1e-9, atol=1e-11)
