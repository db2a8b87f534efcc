"""The lazy decoding state (fw_fairseq/decoding/decoder_state.py) is the same function as naive.py:
steps from the cached writes give the naive loop's outputs (and gradients), and folding the cache
gives its state, so decoding can continue with the fixed-size step (float64)."""
import pytest
import torch

from fw_fairseq.decoding.cache_storage import append, reorder
from fw_fairseq.decoding.backend import backend
from fw_fairseq.decoding.block import Block
from fw_fairseq.decoding.decoder_state import fits, fold, lazy_step
from fw_fairseq.decoding.key_cache import key_cache
from fw_fairseq.ops import RULES, append_z_column
from fw_fairseq.ops.rules.delta.naive import naive_delta, naive_gated_delta
from fw_fairseq.ops.rules.sum.naive import naive_sum
from fw_fairseq.ops.rules.delta.step import step_gated_delta
from fw_fairseq.ops.rules.sum.step import step_sum
from rule_runner import assert_read_matches, make_alpha


def lazy_run(rule, q, k, v, *scalars):
    """Every position of `rule` (an UpdateRule) through lazy_step: (o [B, H, T, M], writes, decay)."""
    outputs, phi_keys, writes, decay = [], None, None, None
    for t in range(q.shape[2]):
        step_scalars = [x[:, :, t: t + 1] for x in scalars]
        row = [x[:, :, t: t + 1] for x in (q, k, v)]  # [B, H, 1, E | M]
        o, phi_keys, writes, decay = lazy_step(rule, *row, phi_keys, writes, decay, *step_scalars)
        outputs.append(o)
    torch.testing.assert_close(phi_keys, k, rtol=0, atol=0)
    return torch.cat(outputs, dim=2), writes, decay


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_lazy_steps_and_fold_match_naive(make_inputs, rule):
    q, k, v, beta, _ = make_inputs(B=2, H=3, T=9, E=6, M=5, requires_grad=True)
    alpha = make_alpha(B=2, H=3, T=9, requires_grad=True)
    if rule == "sum":
        args, naive_args = (v,), (v,)
    elif rule == "delta":
        args, naive_args = (v, beta), (v, beta)
    else:
        args, naive_args = (v, beta, alpha), (v, beta, alpha)
    naive = {"sum": naive_sum, "delta": naive_delta, "gated_delta": naive_gated_delta}[rule]
    o_ref, s_ref = naive(q, k, *naive_args, output_final_state=True)
    o, writes, decay = lazy_run(RULES[rule], q, k, *args)
    torch.testing.assert_close(fold(k, writes, decay), s_ref, rtol=1e-12, atol=1e-12)
    assert (decay is None) == (rule != "gated_delta")
    assert_read_matches(o, o_ref, [q, k, *args], dict(rtol=1e-12, atol=1e-12), dict(rtol=1e-10, atol=1e-12))


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_lazy_steps_without_autograd_write_in_place_and_match_naive(make_inputs, rule):
    """Generation's form: rows appended into the cache's storage (E = 6, M = 5 hold 2 positions, so
    the storage also grows), beam reorders through the spares; outputs and fold as the naive loop's."""
    q, k, v, beta, _ = make_inputs(B=3, H=2, T=7, E=6, M=5)
    alpha = make_alpha(B=3, H=2, T=7)
    scalars = {"sum": (), "delta": (beta,), "gated_delta": (beta, alpha)}[rule]
    naive = {"sum": naive_sum, "delta": naive_delta, "gated_delta": naive_gated_delta}[rule]
    orders = {3: torch.tensor([2, 0, 0]), 5: torch.tensor([1, 2, 1])}
    rows, cache, spares, outputs = torch.arange(3), [None, None, None], [None, None, None], []
    with torch.no_grad():
        for t in range(7):
            if t in orders:
                rows = rows[orders[t]]
                for i, x in enumerate(cache):
                    if x is not None:
                        cache[i], spares[i] = reorder(x, orders[t], spares[i])
            step = [x[rows, :, t: t + 1] for x in (q, k, v, *scalars)]
            o, *cache = lazy_step(RULES[rule], *step[:3], *cache, *step[3:])
            outputs.append((o, rows))
    o_ref, s_ref = naive(q[rows], k[rows], *(x[rows] for x in (v, *scalars)), output_final_state=True)
    # every hypothesis follows one row of the inputs (reorders only repeat rows' histories)
    for t, (o, followed) in enumerate(outputs):
        want = naive(*(x[followed, :, : t + 1] for x in (q, k, v, *scalars)))[0][:, :, t: t + 1]
        torch.testing.assert_close(o, want, rtol=1e-12, atol=1e-12, msg=lambda m: f"step {t}: {m}")
    torch.testing.assert_close(fold(*cache), s_ref, rtol=1e-12, atol=1e-12)


def test_append_writes_into_the_storage_and_reorder_reuses_the_spare():
    with torch.no_grad():
        cache = append(None, torch.ones(2, 1, 1, 3), positions=4)  # storage of 4 positions
        grown = append(cache, torch.full((2, 1, 1, 3), 2.0), positions=4)
        assert grown.data_ptr() == cache.data_ptr() and grown.shape == (2, 1, 2, 3)
        first, spare = reorder(grown, torch.tensor([1, 0]), None)  # a new storage, the old one spare
        second, spare2 = reorder(first, torch.tensor([0]), spare)  # gathered into the spare
        assert second.data_ptr() == grown.data_ptr() and spare2 is first
        assert torch.equal(second, grown[1:]) and append(second, torch.zeros(1, 1, 1, 3), 4).shape[2] == 3
    with_grad = append(grown, torch.zeros(2, 1, 1, 3), positions=4)  # autograd: a concatenation
    assert with_grad.data_ptr() != grown.data_ptr() and torch.equal(with_grad[:, :, :2], grown)


@pytest.mark.parametrize("rule", ["sum", "gated_delta"])
def test_folded_state_continues_with_the_fixed_size_step(make_inputs, rule):
    """Lazy for 5 positions, fold, then step.py for the rest: the naive loop's outputs."""
    q, k, v, beta, _ = make_inputs(B=2, H=2, T=8, E=6, M=4)
    alpha = make_alpha(B=2, H=2, T=8)
    if rule == "sum":
        v = append_z_column(v)
        beta = alpha = None
        o_ref, _ = naive_sum(q, k, v)
    else:
        o_ref, _ = naive_gated_delta(q, k, v, beta, alpha)
    head = [x[:, :, :5] for x in (beta, alpha) if x is not None]
    o_head, writes, decay = lazy_run(RULES[rule], q[:, :, :5], k[:, :, :5], v[:, :, :5], *head)
    state, tail = fold(k[:, :, :5], writes, decay), []
    for t in range(5, 8):
        row = [x[:, :, t: t + 1] for x in (q, k, v)]
        if rule == "sum":
            o, state = step_sum(*row, initial_state=state, output_final_state=True)
        else:
            o, state = step_gated_delta(*row, beta[:, :, t: t + 1], alpha[:, :, t: t + 1],
                                        initial_state=state, output_final_state=True)
        tail.append(o)
    torch.testing.assert_close(torch.cat([o_head, *tail], dim=2), o_ref, rtol=1e-12, atol=1e-12)


def test_fits_compares_the_values_read_with_the_state():
    # DPFP-2 (E = 256), delta rule (M = 64): 51 * 320 = 16320 <= 256 * 64 = 16384 < 52 * 320
    assert fits(51, 256, 64) and not fits(52, 256, 64)
    # ELU sum (E = 64, M = 65): 32 * 129 = 4128 <= 4160 < 33 * 129
    assert fits(32, 64, 65) and not fits(33, 64, 65)


@pytest.mark.parametrize("norm", ["sum", "l2"])
@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("name,d", [("dpfp", 3), ("elu", 10)])
def test_the_maps_cache_matches_the_feature_cache(name, d, rule, norm, cpu_form):
    """A map's lazy cache in generation, stepped by the kernel backend (backend.py) or in PyTorch ops,
    steps like the cache of the normalised features read by plain ops (the default cache, FEATURES): outputs and
    folded state (float64, in place, with a reorder, which the map's cache leaves to the step: `gather`). DPFP keeps the
    raw keys with the writes scaled by the keys' normalisation; ELU+1 keeps the features (E = 10: a vector
    of lanes and a tail)."""
    from fw_fairseq.ops import feature_map, phi_scale

    phi = feature_map(name, d, nu=2)
    g = torch.Generator().manual_seed(7)
    raw = torch.randn(3, 2, 6, d, generator=g, dtype=torch.float64)  # [B, H, T, d]
    raw[1, 0, 2] = 0  # DPFP: phi = 0, clamped by the normalisation, written as nothing
    features = phi(raw, is_query=False)
    scale = phi_scale(features, norm)  # [B, H, T, 1]
    k = features * scale
    q = phi(torch.randn(3, 2, 6, d, generator=g, dtype=torch.float64), is_query=True)
    v = torch.randn(3, 2, 6, 4, generator=g, dtype=torch.float64)
    beta, alpha = (torch.rand(3, 2, 6, generator=g, dtype=torch.float64) for _ in range(2))
    scalars = {"sum": (), "delta": (beta,), "gated_delta": (beta, alpha)}[rule]
    cache = key_cache(phi)
    with torch.no_grad():
        steps = backend(Block.of(RULES[rule], phi, norm), q)  # the kernels, unless cpu_form took them away
        ours, ref, spares, gather = [None] * 3, [None] * 3, [None] * 3, None
        for t in range(6):
            if t == 3:  # beam search's reorder: applied to the feature cache, left to the raw-key one's step
                order = torch.tensor([2, 2, 0])
                for i, x in enumerate(ref):
                    if x is not None:
                        ref[i], spares[i] = reorder(x, order, spares[i])
                if ours[2] is not None:  # the decay is gathered before the step scales it
                    ours[2] = ours[2][order]
                # the outs: views of the first t positions of storages with room for more, as in generation
                gather = (order, *(torch.full((3, 2, 8, x.size(-1)), float("nan"), dtype=x.dtype)[:, :, :t]
                                   for x in ours[:2]))
                q, k, v, raw, scale, *_ = (x[order] for x in (q, k, v, raw, scale))
                scalars = tuple(x[order] for x in scalars)
            step = [x[:, :, t: t + 1] for x in (q, k, v, *scalars)]
            key = raw[:, :, t: t + 1] if name == "dpfp" else None  # [B, H, 1, d]; None: phi_k itself
            o, *ours = lazy_step(RULES[rule], *step[:3], *ours, *step[3:], cache=cache, key=key, norm=norm,
                                 gather=gather, backend=steps)
            gather = None
            o_ref, *ref = lazy_step(RULES[rule], *step[:3], *ref, *step[3:])
            torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12, msg=lambda m: f"step {t}: {m}")
        torch.testing.assert_close(fold(*ours, cache), fold(*ref), rtol=1e-12, atol=1e-12)
