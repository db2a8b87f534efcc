"""Generation's decoder self-attention step from the raw heads (decoder_state.raw_causal_step, on cpu/raw_step.cpp's
raw_lazy_step: phi, its normalisation and the sum rule's z column in the kernel) is the same function as the step
that forms phi in PyTorch first (FeatureMap.cached_step): float64, every feature map x rule x --fw-delta-norm, beam
reorders (traced through the kernel's lineage, also with fewer hypotheses than cache rows) before and after the cache
is folded into the state, and the raw step runs on every lazy step but the first."""
import itertools

import pytest
import torch

from fw_fairseq.modules import FastWeightAttention
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.ops import FEATURE_MAPS, RULES, feature_maps
from fw_fairseq.ops.cpu_extension import cpu_kernel

pytestmark = pytest.mark.skipif(cpu_kernel(torch.zeros(1)) is None, reason="the CPU extension is not built")

C, H, B, STEPS = 16, 2, 3, 12  # head_dim 8: ELU+1's cache (E = 8) folds at step 5, DPFP-2's (C = 8, E = 32) at 12
# before steps 3, 5, 7 and 9 (1-based): hypotheses continued twice, and from step 7 a sentence's fewer (3 -> 2)
REORDERS = {2: [2, 0, 0], 4: [1, 2, 1], 6: [2, 1], 8: [1, 1]}


def _layer(feature_map, rule, norm):
    config = FastWeightConfig(feature_map, rule, 2, 6, frozenset(), delta_norm=norm)
    torch.manual_seed(0)
    layer = FastWeightAttention(C, H, config, causal=True).double().eval()
    with torch.no_grad():  # scalars far from their init: beta and alpha differ per head and step
        for name in layer.rule.scalars:
            getattr(layer, f"{name}_proj").weight.normal_()
    return layer


def _decode(layer, xs, monkeypatch, raw):
    """The layer's outputs [1, B, C] step by step over xs [T, B, C] (the first B of them: as many as there are
    hypotheses) with REORDERS; the steps that ran raw."""
    ran = []
    original = feature_maps.FeatureMap.raw_step

    def counted(self, *args):
        ran.append(len(outputs))
        return original(self, *args)

    monkeypatch.setattr(feature_maps.FeatureMap, "raw_step", counted)
    if not raw:
        monkeypatch.setattr(feature_maps.FeatureMap, "has_raw_step", lambda self, q, cached: False)
    state, outputs, rows = {}, [], xs.size(1)
    with torch.no_grad():
        for t in range(len(xs)):
            if t in REORDERS:
                layer.reorder_incremental_state(state, torch.tensor(REORDERS[t]))
                rows = len(REORDERS[t])
            x = xs[t: t + 1, :rows]
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
    assert ran == list(range(min(lazy_steps, STEPS)))  # every lazy step, the first one's too (0-based)
    for t, (got, expected) in enumerate(zip(ours, want)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=lambda m: f"step {t + 1}: {m}")


@pytest.mark.parametrize("call,message", [
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 7, 2, None, None, None,
                                                     *_outs(keys, writes), 0, 1e-6, False, 1e-6), "map must be 0"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys[..., :3], writes, None, 0, 2, None, None, None,
                                                     *_outs(keys[..., :3], writes), 0, 1e-6, False, 1e-6),
     "keys must be \\[B, H, t, 4\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q[:, :, :, :3], k, k, None, keys, writes, None, 0, 2, None,
                                                     None, None, *_outs(keys, writes), 0, 1e-6, False, 1e-6),
     "q and k must be \\[B, H, 1, d\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 3, 1, None, None, None,
                                                     *_outs(keys, writes), 0, 1e-6, False, 1e-6),
     "favor needs its projection"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 0, 2, None, None, None,
                                                     keys, writes, 0, 1e-6, False, 1e-6),
     "keys_out must be \\[B, H, 3, width\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 0, 2, None, None, None,
                                                     *_outs(keys, writes), 0, 1e-6, True, 1e-6),
     "v must be \\[B, H, 1, 3\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 0, 2, None, None,
                                                     torch.zeros(2, 2, dtype=torch.long), *_outs(keys, writes), 0,
                                                     1e-6, False, 1e-6),
     "a lineage takes the caches' own storages"),
    (lambda kn, q, k, keys, writes: _traced(kn, q, k, torch.tensor([[0, 2], [1, 1]])), "lineage holds 2, not a cache row"),
    (lambda kn, q, k, keys, writes: _traced(kn, q, k, torch.zeros(2, 3, dtype=torch.long)),
     "lineage must be \\[B', t\\] int64"),
])
def test_raw_lazy_step_refuses_bad_arguments_in_one_line(call, message):
    q = torch.randn(2, 2, 1, 4, dtype=torch.float64)
    keys, writes = torch.randn(2, 2, 2, 4, dtype=torch.float64), torch.randn(2, 2, 2, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=message):
        call(cpu_kernel(q), q, q.clone(), keys, writes)


def _outs(keys, writes):
    """Views of one more position than keys and writes [B, H, t, .] have, as generation grows them."""
    return tuple(torch.empty(*x.shape[:2], x.size(2) + 1, x.size(3), dtype=x.dtype) for x in (keys, writes))


def _traced(kernel, q, k, lineage):
    """A traced step (lineage given) of ELU+1 over caches of 2 positions in storages of 3: the outs are the storages."""
    storages = [torch.randn(2, 2, 3, 4, dtype=torch.float64) for _ in range(2)]
    keys, writes = (x[:, :, :2] for x in storages)
    return kernel.raw_lazy_step(q, k, k, None, keys, writes, None, 1, 0, None, None, lineage, *storages, 0, 1e-6,
                                False, 1e-6)


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


def test_without_outs_the_step_appends_in_the_storages_where_they_have_room():
    """outs None: the kernel makes the views of t + 1 positions of the caches' own storages and steps as with them
    given; storages without room for position t (a cache of exactly t positions) run nothing and return None."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 1, 4, dtype=torch.float64, generator=g) for _ in range(3))
    storages = [torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=g) for _ in range(2)]  # ELU+1: C = E = 4
    keys, writes = (x[:, :, :2] for x in storages)
    args = (None, keys, writes, None, 1, 0, None, None, None)
    given = [x.clone() for x in storages]
    want, _, *_ = cpu_kernel(q).raw_lazy_step(q, k, v, *args, *(x[:, :, :3] for x in given), 0, 1e-6, False, 1e-6)
    o, lineage, keys_out, writes_out = cpu_kernel(q).raw_lazy_step(q, k, v, *args, None, None, 0, 1e-6, False, 1e-6)
    torch.testing.assert_close(o, want, rtol=0, atol=0)
    assert lineage is None
    for out, storage, expected in zip((keys_out, writes_out), storages, given):
        assert out.shape == (2, 2, 3, 4) and out.data_ptr() == storage.data_ptr()
        torch.testing.assert_close(storage, expected, rtol=0, atol=0)  # position 2 written, nothing else
    full = [x.clone() for x in storages]  # caches of 5 positions in storages of 5: no room for a sixth
    assert cpu_kernel(q).raw_lazy_step(q, k, v, None, *full, None, 1, 0, None, None, None, None, None, 0, 1e-6, False,
                                       1e-6) == (None, None, None, None)


@pytest.mark.parametrize("feature_map,rule", [("dpfp", "delta"), ("elu", "sum")])
def test_a_cache_without_room_grows_and_decodes_the_same(feature_map, rule):
    """Caches whose storages hold exactly their t positions (not laid out by cache_storage) take the step's fallback:
    grown in Python, then the same raw step; the outputs equal those of the usual decoding."""
    layer = _layer(feature_map, rule, "sum")
    xs = torch.randn(4, B, C, dtype=torch.float64, generator=torch.Generator().manual_seed(2))

    def decode(exact_at):
        state, outputs = {}, []
        with torch.no_grad():
            for t, x in enumerate(xs.split(1)):
                if t == exact_at:  # the cache as tensors of exactly t positions: no room for position t
                    buffer = layer._get_input_buffer(state)
                    buffer["keys"], buffer["writes"] = buffer["keys"].clone(), buffer["writes"].clone()
                outputs.append(layer(x, x, x, incremental_state=state)[0])
        return outputs, layer._get_input_buffer(state)["keys"]

    (got, keys), (want, _) = decode(exact_at=2), decode(exact_at=None)
    assert keys.size(2) == 4 and keys.stride(1) > 4 * keys.size(3)  # grown into a storage with room again
    for t, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"step {t + 1}: {m}")
