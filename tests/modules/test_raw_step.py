"""Generation's decoder self-attention step from the raw heads (decoder_state.raw_causal_step, on cpu/lazy_step.cpp's
raw_lazy_step: phi, its normalisation and the sum rule's z column in the kernel) is the same function as the step
that forms phi in PyTorch first (FeatureMap.cached_step): float64, every feature map x rule x --fw-delta-norm, beam
reorders before and after the cache is folded into the state, and the raw step runs on every lazy step but the
first."""
import itertools

import pytest
import torch

from fw_fairseq.modules import FastWeightAttention
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.ops import FEATURE_MAPS, RULES, feature_maps
from fw_fairseq.ops.cpu_extension import cpu_kernel

pytestmark = pytest.mark.skipif(cpu_kernel(torch.zeros(1)) is None, reason="the CPU extension is not built")

C, H, B, STEPS = 16, 2, 3, 12  # head_dim 8: ELU+1's cache (E = 8) folds at step 5, DPFP-2's (C = 8, E = 32) at 12
REORDERS = {2: [2, 0, 0], 4: [1, 2, 1], 7: [0, 0, 2]}  # before steps 3, 5 and 8 (1-based)


def _layer(feature_map, rule, norm):
    config = FastWeightConfig(feature_map, rule, 2, 6, frozenset(), delta_norm=norm)
    torch.manual_seed(0)
    layer = FastWeightAttention(C, H, config, causal=True).double().eval()
    with torch.no_grad():  # scalars far from their init: beta and alpha differ per head and step
        for name in layer.rule.scalars:
            getattr(layer, f"{name}_proj").weight.normal_()
    return layer


def _decode(layer, xs, monkeypatch, raw):
    """The layer's outputs [1, B, C] step by step over xs [T, B, C] with REORDERS; the steps that ran raw."""
    ran = []
    original = feature_maps.FeatureMap.raw_step

    def counted(self, *args):
        ran.append(len(outputs))
        return original(self, *args)

    monkeypatch.setattr(feature_maps.FeatureMap, "raw_step", counted)
    if not raw:
        monkeypatch.setattr(feature_maps.FeatureMap, "has_raw_step", lambda self, q, cached: False)
    state, outputs = {}, []
    with torch.no_grad():
        for t in range(len(xs)):
            if t in REORDERS:
                layer.reorder_incremental_state(state, torch.tensor(REORDERS[t]))
            x = xs[t: t + 1]
            outputs.append(layer(x, x, x, incremental_state=state)[0])
    monkeypatch.undo()
    return outputs, ran


@pytest.mark.parametrize("norm", ["sum", "l2"])
@pytest.mark.parametrize("feature_map,rule", list(itertools.product(FEATURE_MAPS, RULES)))
def test_the_raw_step_equals_the_features_step(feature_map, rule, norm, monkeypatch):
    if rule == "sum" and norm == "l2":
        pytest.skip("the sum rule does not normalise phi (divide_by_z): one norm covers it")
    layer = _layer(feature_map, rule, norm)
    xs = torch.randn(STEPS, B, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours, ran = _decode(layer, xs, monkeypatch, raw=True)
    want, none = _decode(layer, xs, monkeypatch, raw=False)
    assert none == []
    lazy_steps = layer.phi.out_dim * (layer.head_dim + layer.rule.z_column) // (
        layer.phi.cache_width + layer.head_dim + layer.rule.z_column)  # the positions a cache holds: `capacity`
    assert ran == list(range(1, min(lazy_steps, STEPS)))  # every lazy step but the first (0-based)
    for t, (got, expected) in enumerate(zip(ours, want)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=lambda m: f"step {t + 1}: {m}")


@pytest.mark.parametrize("call,message", [
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 7, 2, None, None,
                                                     *_outs(keys, writes), 0, 1e-6, False, 1e-6), "map must be 0"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys[..., :3], writes, None, 0, 2, None, None,
                                                     *_outs(keys[..., :3], writes), 0, 1e-6, False, 1e-6),
     "keys must be \\[B, H, t, 4\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q[:, :, :, :3], k, k, None, keys, writes, None, 0, 2, None,
                                                     None, *_outs(keys, writes), 0, 1e-6, False, 1e-6),
     "q and k must be \\[B, H, 1, d\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 3, 1, None, None,
                                                     *_outs(keys, writes), 0, 1e-6, False, 1e-6),
     "favor needs its projection"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 0, 2, None, None,
                                                     keys, writes, 0, 1e-6, False, 1e-6),
     "keys_out must be \\[B, H, 3, width\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 0, 2, None, None,
                                                     *_outs(keys, writes), 0, 1e-6, True, 1e-6),
     "v must be \\[B, H, 1, 3\\]"),
])
def test_raw_lazy_step_refuses_bad_arguments_in_one_line(call, message):
    q = torch.randn(2, 2, 1, 4, dtype=torch.float64)
    keys, writes = torch.randn(2, 2, 2, 4, dtype=torch.float64), torch.randn(2, 2, 2, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=message):
        call(cpu_kernel(q), q, q.clone(), keys, writes)


def _outs(keys, writes):
    """Views of one more position than keys and writes [B, H, t, .] have, as generation grows them."""
    return tuple(torch.empty(*x.shape[:2], x.size(2) + 1, x.size(3), dtype=x.dtype) for x in (keys, writes))


@pytest.mark.parametrize("source,map,message", [
    (torch.randn(2, 2, 3, 20, dtype=torch.float64), 5, "map must be 0"),
    (torch.randn(3, 2, 3, 20, dtype=torch.float64), 1, "R dividing B"),
    (torch.randn(2, 2, 3, 4, dtype=torch.float64), 1, "source must be \\[R, H, S, E \\+ M\\] \\(S < E\\)"),
    (torch.randn(2, 2, 3, 20).float(), 1, "of q's dtype"),
])
def test_raw_source_read_refuses_bad_arguments_in_one_line(source, map, message):
    q = torch.randn(4, 2, 1, 4, dtype=torch.float64)  # ELU+1: E = 4; the cache form [R, H, S, E + M]
    with pytest.raises(RuntimeError, match=message):
        cpu_kernel(q).raw_source_read(q, source, map, 0, None, 0, 1e-6, False, 1e-6)
