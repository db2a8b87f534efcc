"""The lazy decoding state of the decoder self-attention (fw_fairseq/decoding/decoder_state.py):
token-by-token decoding equals teacher forcing (float64) before, at and after the step where the
cache of the keys (DPFP: the raw keys, scored by its kernel in generation) and the writes is folded into the [E, M] state, for every feature
map x rule, with beam reordering on both sides of the switch and left-padded sources and targets."""
import itertools

import pytest
import torch

from factories import build_model, random_tokens
from fw_fairseq.decoding.buffer_order import LINEAGE, ORDER
from fw_fairseq.ops import FEATURE_MAPS, RULES

BSZ, SRC_LEN = 3, 7


def fw_args(feature_map, rule, delta_norm="sum"):
    # no positional embeddings: fairseq's incremental positions ignore left padding of the targets
    # (teacher forcing counts only real tokens), which would differ for reasons outside attention
    return ["--fw-feature-map", feature_map, "--fw-update-rule", rule, "--fw-decoder-rule", rule, "--fw-dpfp-nu", "2",
            "--fw-favor-features", "24", "--fw-delta-norm", delta_norm, "--no-token-positional-embeddings"]


def switch_step(attention):
    """The first decoding step (1-based) whose cache of t positions would read more values,
    t (C + M) with C the cached key's width, than the [E, M] state: E M // (C + M) + 1."""
    d, E, C = attention.head_dim, attention.phi.out_dim, attention.block.keys.width
    M = d + 1 if attention.rule.z_column else d
    return E * M // (C + M) + 1


def left_padded(d, lengths, width, g):
    tokens = torch.full((len(lengths), width), d.pad())
    for i, n in enumerate(lengths):
        tokens[i, width - n:] = random_tokens(d, 1, n, g)[0]
    return tokens


@pytest.mark.parametrize("grad", [False, True], ids=["generation", "autograd"])
@pytest.mark.parametrize("feature_map,rule", list(itertools.product(FEATURE_MAPS, RULES)))
def test_lazy_decoding_equals_teacher_forcing_across_the_switch(feature_map, rule, grad):
    """Without autograd (fairseq-generate) the cache is appended in place, reordered through spares
    and the state stepped in place; with autograd every step makes new tensors."""
    with torch.set_grad_enabled(grad):
        _decode_across_the_switch(fw_args(feature_map, rule), rule)


@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
def test_raw_key_cache_with_l2_normalised_keys(rule):
    """DPFP's cache keeps raw keys and scales the writes by the keys' normalisation: L2 as well as sum."""
    with torch.no_grad():
        _decode_across_the_switch(fw_args("dpfp", rule, delta_norm="l2"), rule)


@pytest.mark.parametrize("feature_map", ["dpfp", "favor"])
def test_the_decoder_convolution_counts_padded_targets_as_zeros_step_by_step(feature_map):
    """A left-padded target's padding enters the convolution's window as zeros at each step, as in teacher forcing
    (FAVOR+'s translation defaults have the convolution; here it is given to both maps)."""
    with torch.no_grad():
        _decode_across_the_switch(fw_args(feature_map, "delta") + ["--fw-decoder-conv", "3"], "delta")


def _decode_across_the_switch(args, rule):
    model, d = build_model(args)
    attention = model.decoder.layers[0].self_attn
    switch = switch_step(attention)
    steps = switch + 3
    g = torch.Generator().manual_seed(0)
    src = left_padded(d, [7, 5, 3], SRC_LEN, g)
    src_lengths = torch.tensor([7, 5, 3])
    prev = left_padded(d, [steps, steps - 2, steps - 5], steps, g)  # targets padded on the left too
    # reorders (repeating and dropping rows) before step 3 (cache live), before the switch step
    # (the cache is reordered, then folded) and two steps after it (the state is reordered)
    reorders = {2: torch.tensor([2, 0, 0]), switch - 1: torch.tensor([1, 2, 1]),
                switch + 1: torch.tensor([0, 0, 2])}
    order, state = torch.arange(BSZ), {}
    encoder_out = model.encoder(src, src_lengths=src_lengths)
    stepwise, expected = [], {}
    for t in range(steps):
        if t in reorders:
            model.decoder.reorder_incremental_state_scripting(state, reorders[t])
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, reorders[t])
            order = order[reorders[t]]
        key = tuple(order.tolist())
        if key not in expected:
            expected[key] = model(src[order], src_lengths[order], prev[order])[0]
        logits, _ = model.decoder(prev[order, : t + 1], encoder_out=encoder_out, incremental_state=state)
        stepwise.append((logits[:, -1], expected[key][:, t]))
        buffer = attention._get_input_buffer(state)
        lazy = t + 1 < switch  # step t + 1 (1-based) just ran
        assert ("keys" in buffer) == lazy and ("state" in buffer) == (not lazy), (t, sorted(buffer))
        assert ("decay" in buffer) == (lazy and rule == "gated_delta")
        if lazy:
            assert buffer["keys"].shape == (BSZ, attention.num_heads, t + 1, attention.block.keys.width)
    for t, (got, want) in enumerate(stepwise):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=lambda m: f"step {t + 1}: {m}")


@pytest.mark.parametrize("feature_map,rule", [("dpfp", "delta"), ("elu", "sum")])
def test_memory_grows_until_the_switch_then_stays_flat(feature_map, rule):
    model, d = build_model(fw_args(feature_map, rule))
    attention = model.decoder.layers[0].self_attn
    switch = switch_step(attention)
    g = torch.Generator().manual_seed(4)
    src, prev = random_tokens(d, 2, 5, g), random_tokens(d, 2, switch + 6, g)
    encoder_out = model.encoder(src, src_lengths=torch.full((2,), 5))
    state, sizes, storages = {}, [], []
    for t in range(prev.size(1)):
        with torch.no_grad():
            model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
            if t % 2:  # beam search's reorders bring the spares
                model.decoder.reorder_incremental_state_scripting(state, torch.tensor([1, 0]))
        buffer = attention._get_input_buffer(state)
        # the entries' values, leaving out the spares and the reorders' indices (a reorder left for the next step,
        # B of them; the raw step's lineage, B t)
        sizes.append(sum(x.numel() for name, x in buffer.items()
                         if x is not None and "spare" not in name and name not in (ORDER, LINEAGE)))
        storages.append(sum({x.untyped_storage().data_ptr(): x.untyped_storage().nbytes()
                             for name, x in buffer.items() if x is not None and name not in (ORDER, LINEAGE)}.values()))
    lazy, folded = sizes[: switch - 1], sizes[switch - 1:]
    assert lazy == sorted(set(lazy)), lazy  # the cache grows by one position per step
    assert len(set(folded)) == 1 and folded[0] >= lazy[-1], sizes  # then the fixed-size state
    # what is allocated: the cache's storages at their full capacity from the first step, and their spares
    # from the step after the first reorder (reorders are left to the next step), then the state's
    assert len(set(storages[2: switch - 1])) == 1 and len(set(storages[switch + 1:])) == 1, storages
    assert max(storages) <= 2 * storages[-1], storages  # a spare each: never above two states


def test_an_identity_reorder_copies_nothing():
    """fairseq reorders at every step (beam 1 too): the identity keeps every cached tensor as it is."""
    model, d = build_model(fw_args("dpfp", "delta"))
    g = torch.Generator().manual_seed(5)
    src, prev = random_tokens(d, BSZ, 5, g), random_tokens(d, BSZ, 2, g)
    encoder_out = model.encoder(src, src_lengths=torch.full((BSZ,), 5))
    state = {}
    for t in range(2):
        model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)
    before = {key: dict(buffer) for key, buffer in state.items()}
    model.decoder.reorder_incremental_state_scripting(state, torch.arange(BSZ))
    assert all(state[key][name] is x for key, buffer in before.items() for name, x in buffer.items())
    model.decoder.reorder_incremental_state_scripting(state, torch.tensor([1, 0, 2]))
    lazy = [key for key, buffer in before.items() if "writes" in buffer]
    assert len(lazy) == 2  # the two decoder self-attention layers hold their lazy caches
    assert all(state[key]["writes"] is not before[key]["writes"] for key in lazy)
