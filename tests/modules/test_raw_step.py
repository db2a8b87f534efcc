"""Generation's decoder self-attention step from the raw heads (decoder_state.raw_causal_step, on
csrc/cpu/raw_step.cpp's raw_lazy_step: phi, its normalisation and the sum rule's z column in the kernel) is the same
function as the step that forms phi in PyTorch first (the kernel backend's lazy_step, decoding/backend.py): float64,
every feature map x rule x --fw-delta-norm, beam reorders (traced through the kernel's lineage, also with fewer
hypotheses than cache rows) before and after the cache is folded into the state, and the raw step runs on every lazy
step but the first."""
import itertools

import pytest
import torch

from fw_fairseq.modules import FastWeightAttention
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.ops import FEATURE_MAPS, RULES
from fw_fairseq.decoding.backend import KernelBackend
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS, cpu_kernel

pytestmark = pytest.mark.skipif(cpu_kernel(torch.zeros(1)) is None, reason="the CPU extension is not built")

C, H, B, STEPS = 16, 2, 3, 12  # head_dim 8: ELU+1's cache (E = 8) folds at step 5, DPFP-2's (C = 8, E = 32) at 12
# before steps 3, 5, 7 and 9 (1-based): hypotheses continued twice, and from step 7 a sentence's fewer (3 -> 2)
REORDERS = {2: [2, 0, 0], 4: [1, 2, 1], 6: [2, 1], 8: [1, 1]}


ROW_FORM_MAPS = [name for name in FEATURE_MAPS if name in KERNEL_MAPS]  # the maps the kernels form from raw rows


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
    original = KernelBackend.raw_step

    def counted(self, *args):
        ran.append(len(outputs))
        return original(self, *args)

    monkeypatch.setattr(KernelBackend, "raw_step", counted)
    if not raw:
        monkeypatch.setattr(KernelBackend, "raw", False)
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
@pytest.mark.parametrize("feature_map,rule", list(itertools.product(ROW_FORM_MAPS, RULES)))
def test_the_raw_step_equals_the_features_step(feature_map, rule, norm, monkeypatch):
    if rule == "sum" and norm == "l2":
        pytest.skip("the sum rule does not normalise phi (divide_by_z): one norm covers it")
    layer = _layer(feature_map, rule, norm)
    xs = torch.randn(STEPS, B, C, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    ours, ran = _decode(layer, xs, monkeypatch, raw=True)
    want, none = _decode(layer, xs, monkeypatch, raw=False)
    assert none == []
    lazy_steps = layer.phi.out_dim * (layer.head_dim + layer.rule.z_column) // (
        layer.block.keys.width + layer.head_dim + layer.rule.z_column)  # the positions a cache holds: `capacity`
    assert ran == list(range(min(lazy_steps, STEPS)))  # every lazy step, the first one's too (0-based)
    for t, (got, expected) in enumerate(zip(ours, want)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=lambda m: f"step {t + 1}: {m}")


@pytest.mark.parametrize("call,message", [
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 7, 2, None, None, None, 0, 1e-6,
                                                     False, 1e-6), "map must be 0"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, *_cache(3, 4), None, 0, 2, None, None, None, 0,
                                                     1e-6, False, 1e-6),
     "keys must be \\[B, H, t, 4\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q[:, :, :, :3], k, k, None, keys, writes, None, 0, 2, None,
                                                     None, None, 0, 1e-6, False, 1e-6),
     "q and k must be \\[B, H, 1, d\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 3, 1, None, None, None, 0, 1e-6,
                                                     False, 1e-6),
     "favor needs its projection"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 0, 2, None, None, None, 0, 1e-6,
                                                     True, 1e-6),
     "v must be \\[B, H, 1, 3\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys[0], writes, None, 0, 2, None, None, None, 0,
                                                     1e-6, False, 1e-6),
     "keys and writes must be \\[B, H, t, d\\] and \\[B, H, t, M\\]"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 1, 0, None, None,
                                                     torch.tensor([[0, 2], [1, 1]]), 0, 1e-6, False, 1e-6),
     "lineage holds 2, not a cache row"),
    (lambda kn, q, k, keys, writes: kn.raw_lazy_step(q, k, k, None, keys, writes, None, 1, 0, None, None,
                                                     torch.zeros(2, 3, dtype=torch.long), 0, 1e-6, False, 1e-6),
     "lineage must be \\[B', t\\] int64"),
])
def test_raw_lazy_step_refuses_bad_arguments_in_one_line(call, message):
    q = torch.randn(2, 2, 1, 4, dtype=torch.float64)
    with pytest.raises(RuntimeError, match=message):
        call(cpu_kernel(q), q, q.clone(), *_cache(4, 4))


def _cache(key_width, width):
    """Keys and writes [2, 2, 2, .] of widths key_width and width, views of storages of 3 positions, as generation
    lays them out (cache_storage.started, grown)."""
    return tuple(torch.randn(2, 2, 3, w, dtype=torch.float64)[:, :, :2] for w in (key_width, width))


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


def test_the_step_appends_in_the_storages_where_they_have_room():
    """The kernel appends position t in the caches' own storages, returns their views of t + 1 positions and touches
    nothing else; storages without room for position t (a cache of exactly t positions) run nothing: None."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 1, 4, dtype=torch.float64, generator=g) for _ in range(3))
    storages = [torch.randn(2, 2, 5, 4, dtype=torch.float64, generator=g) for _ in range(2)]  # ELU+1: C = E = 4
    before = [x.clone() for x in storages]
    tail = (None, 1, 0, None, None, None, 0, 1e-6, False, 1e-6)  # decay .. z_eps: ELU+1, no reorder, no lineage
    o, lineage, *outs = cpu_kernel(q).raw_lazy_step(q, k, v, None, *(x[:, :, :2] for x in storages), *tail)
    assert o.shape == (2, 2, 1, 4) and lineage is None
    for out, storage, old in zip(outs, storages, before):
        assert out.shape == (2, 2, 3, 4) and out.data_ptr() == storage.data_ptr()
        changed = (storage != old).any(-1)  # [2, 2, 5]: the positions written
        assert changed[:, :, 2].all() and not changed[:, :, [0, 1, 3, 4]].any()
    assert cpu_kernel(q).raw_lazy_step(q, k, v, None, *storages, *tail) == (None, None, None, None)


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
