"""The cached source of cross-attention in generation (fw_fairseq/decoding/source_memory.py): short
sources keep their keys' features and effective writes [rows, H, S, E + M], longer ones the memory
[rows, H, E, M]. Token-by-token decoding with either form equals teacher-forced cross-attention
(float64) for every feature map x rule, with left-padded sources, one cached row per sentence
shared by its beams, and beam reorders that keep, drop and split sentence groups. A step after the first reads the
source from the raw queries in one kernel call where the CPU extension is built (KernelBackend.source_read), the
same function as forming phi(q) first."""
import itertools

import pytest
import torch

from factories import randomize_scalar_projections
from fw_fairseq.modules import FastWeightAttention, FastWeightConfig
from fw_fairseq.decoding import source_memory
from fw_fairseq.decoding.backend import KernelBackend
from fw_fairseq.ops import FEATURE_MAPS, RULES
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS
from fw_fairseq.ops.kernels.cpu_extension import cpu_kernel

C, H = 32, 2  # d_key 16
SENTENCES, BEAM = 3, 2


def cross_attention(feature_map, rule):
    torch.manual_seed(0)
    config = FastWeightConfig(feature_map, rule, 2, 24, frozenset(), 2)
    attn = FastWeightAttention(C, H, config, causal=False, encoder_decoder_attention=True)
    attn = attn.double().eval()
    return randomize_scalar_projections(attn, torch.Generator().manual_seed(1))


def widths(attn):
    """(E, M) of a head: the features and the written values (the sum rule's z column included)."""
    return attn.phi.out_dim, attn.head_dim + (1 if attn.rule.z_column else 0)


def longest_cached(attn):
    """The longest source kept as keys and writes: S (E + M) < E M."""
    E, M = widths(attn)
    return (E * M - 1) // (E + M)


def sources(length):
    """Keys [S, B, C] and padding [B, S] of SENTENCES left-padded sources, each repeated for its
    BEAM hypotheses as fairseq's generator lays them out."""
    g = torch.Generator().manual_seed(2)
    key = torch.randn(length, SENTENCES, C, generator=g, dtype=torch.float64)
    pad = torch.zeros(SENTENCES, length, dtype=torch.bool)
    pad[1, :2], pad[2, :3] = True, True
    key = key.masked_fill(pad.T[..., None], 0.0)
    return key.repeat_interleave(BEAM, dim=1), pad.repeat_interleave(BEAM, dim=0)


# before steps 2, 3, 4: permute within the groups (kept), drop sentence 1 (6 -> 4 hypotheses),
# then mix the remaining sentences' beams in one group (split: a row per hypothesis)
ROW_FORM_MAPS = [name for name in FEATURE_MAPS if name in KERNEL_MAPS]  # the maps the kernels form from raw rows
REORDERS = {1: [1, 0, 2, 3, 5, 4], 2: [0, 1, 4, 5], 3: [0, 2, 2, 1]}


def decode(attn, key, pad, steps=5):
    """Cached outputs of `steps` one-token queries with the reorders, each beside the teacher-
    forced output of the same hypotheses; and the cached source's shape after the first step."""
    attn.set_beam_size(BEAM)
    g = torch.Generator().manual_seed(3)
    order, state, pairs, shape = torch.arange(key.size(1)), {}, [], None
    for t in range(steps):
        if t in REORDERS:
            new_order = torch.tensor(REORDERS[t])
            attn.reorder_incremental_state(state, new_order)
            order = order[new_order]
        query = torch.randn(1, order.numel(), C, generator=g, dtype=torch.float64)
        cached, _ = attn(query, key, key, key_padding_mask=pad, incremental_state=state, static_kv=True)
        hypotheses = key[:, order]  # [S, B', C]
        forced, _ = attn(query, hypotheses, hypotheses, key_padding_mask=pad[order], static_kv=True)
        pairs.append((cached, forced))
        if shape is None:
            shape = attn._get_input_buffer(state)["memory"].shape
    return pairs, shape


@pytest.mark.parametrize("feature_map,rule", list(itertools.product(FEATURE_MAPS, RULES)))
@pytest.mark.parametrize("cached", [True, False])
def test_cached_source_equals_teacher_forcing(feature_map, rule, cached, monkeypatch):
    attn = cross_attention(feature_map, rule)
    E, M = widths(attn)
    length = longest_cached(attn) if cached else longest_cached(attn) + 1
    assert length > 3  # longer than the padding
    pairs, shape = decode(attn, *sources(length))
    # one row per sentence, in the form that reads fewer values
    assert shape == ((SENTENCES, H, length, E + M) if cached else (SENTENCES, H, E, M))
    for t, (got, want) in enumerate(pairs):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, msg=lambda m: f"step {t}: {m}")
    if cached:  # the same source in the memory form decodes the same
        monkeypatch.setattr(source_memory, "source_fits", lambda *shapes: False)
        memory_pairs, memory_shape = decode(attn, *sources(length))
        assert memory_shape == (SENTENCES, H, E, M)
        for (got, _), (want, _) in zip(pairs, memory_pairs):
            torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(cpu_kernel(torch.zeros(1)) is None, reason="the CPU extension is not built")
@pytest.mark.parametrize("feature_map,rule", list(itertools.product(ROW_FORM_MAPS, RULES)))
@pytest.mark.parametrize("cached", [True, False])
def test_steps_read_the_source_from_the_raw_queries(feature_map, rule, cached, monkeypatch):
    """Every step but the first (which writes the source) reads through the kernel's source_read, equal to the read of
    phi(q) (float64) in both forms of the source."""
    attn = cross_attention(feature_map, rule)
    length = longest_cached(attn) + (0 if cached else 1)
    calls, original = [], KernelBackend.source_read
    monkeypatch.setattr(KernelBackend, "source_read", lambda self, *args: calls.append(1) or original(self, *args))
    raw, _ = decode(attn, *sources(length))
    assert len(calls) == len(raw) - 1
    monkeypatch.setattr(KernelBackend, "raw", False)
    features, _ = decode(attn, *sources(length))
    assert len(calls) == len(raw) - 1
    for t, ((got, _), (want, _)) in enumerate(zip(raw, features)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"step {t}: {m}")


@pytest.mark.parametrize("rule", RULES)
def test_effective_writes_sum_to_the_memory(rule):
    """sum_s phi(k_s)^T u_s is the rule's memory, also with gates near 0 and 1 and padding."""
    g = torch.Generator().manual_seed(4)
    B, S, E, M = 2, 9, 12, 5
    phi_k = torch.rand(B, H, S, E, generator=g, dtype=torch.float64)
    phi_k = phi_k / phi_k.sum(-1, keepdim=True)
    v = torch.randn(B, H, S, M, generator=g, dtype=torch.float64)
    scalars = {"beta": 2 * torch.rand(B, H, S, generator=g, dtype=torch.float64),
               "alpha": torch.rand(B, H, S, generator=g, dtype=torch.float64) ** 4}
    phi_k[0, :, :3], scalars["beta"][0, :, :3], scalars["alpha"][0, :, :3] = 0.0, 0.0, 1.0  # padded
    scalars = [scalars[name] for name in RULES[rule].scalars]
    u = RULES[rule].writes(phi_k, v, *scalars)
    torch.testing.assert_close(phi_k.transpose(-1, -2) @ u, RULES[rule].write(phi_k, v, *scalars),
                               rtol=1e-12, atol=1e-12)
    if scalars:  # beta = 0: padded positions write nothing (the sum rule's are read through phi(k) = 0)
        assert u[0, :, :3].abs().max() == 0
