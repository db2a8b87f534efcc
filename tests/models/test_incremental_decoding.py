"""Token-by-token decoding with incremental_state equals the teacher-forced forward (float64, eval)."""
import itertools

import pytest
import torch

from factories import build_model, decode_step_by_step, random_tokens
from fw_fairseq.ops import FEATURE_MAPS, RULES

# every feature map x rule, and the delta rules with beta in (0, 1) and in (0, 2)
ALL = [(feature_map, rule, beta_max) for feature_map, rule in itertools.product(FEATURE_MAPS, RULES)
       for beta_max in ((1, 2) if "beta" in RULES[rule].scalars else (1,))]


def fw_args(feature_map, rule, places="all", beta_max=1):
    return ["--fw-feature-map", feature_map, "--fw-update-rule", rule, "--fw-decoder-rule", rule, "--fw-dpfp-nu", "2",
            "--fw-favor-features", "24", "--fw-attention", places,
            "--fw-delta-beta-max", str(beta_max)]


@pytest.mark.parametrize("feature_map,rule,beta_max", ALL)
def test_incremental_equals_teacher_forced(feature_map, rule, beta_max):
    model, d = build_model(fw_args(feature_map, rule, beta_max=beta_max))
    g = torch.Generator().manual_seed(1)
    src, prev = random_tokens(d, 3, 9, g), random_tokens(d, 3, 7, g)
    lengths = torch.full((3,), 9)
    full, _ = model(src, lengths, prev)
    encoder_out = model.encoder(src, src_lengths=lengths)
    stepwise = decode_step_by_step(model, prev, encoder_out)
    torch.testing.assert_close(stepwise, full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("places", ["decoder", "cross", "encoder,decoder"])
def test_incremental_with_some_softmax_blocks(places):
    model, d = build_model(fw_args("dpfp", "delta", places))
    g = torch.Generator().manual_seed(2)
    src, prev = random_tokens(d, 2, 6, g), random_tokens(d, 2, 5, g)
    full, _ = model(src, torch.full((2,), 6), prev)
    encoder_out = model.encoder(src, src_lengths=torch.full((2,), 6))
    # fairseq's softmax attention computes its softmax in float32 even for float64 inputs.
    torch.testing.assert_close(decode_step_by_step(model, prev, encoder_out), full,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("feature_map,rule", [("dpfp", "sum"), ("favor", "delta"),
                                              ("elu", "gated_delta")])
def test_reorder_equals_decoding_permuted_batch(feature_map, rule):
    model, d = build_model(fw_args(feature_map, rule))
    g = torch.Generator().manual_seed(3)
    src, prev = random_tokens(d, 4, 8, g), random_tokens(d, 4, 6, g)
    lengths = torch.full((4,), 8)
    # Beam-search style: the new order repeats some rows and drops others.
    new_order = torch.tensor([2, 0, 0, 3])

    state = {}
    encoder_out = model.encoder(src, src_lengths=lengths)
    decode_step_by_step(model, prev[:, :3], encoder_out, state)
    model.decoder.reorder_incremental_state_scripting(state, new_order)
    encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
    tail = []
    for t in range(3, 6):
        logits, _ = model.decoder(prev[new_order, : t + 1], encoder_out=encoder_out,
                                  incremental_state=state)
        tail.append(logits)

    full, _ = model(src[new_order], lengths, prev[new_order])
    torch.testing.assert_close(torch.cat(tail, dim=1), full[:, 3:], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("rule", RULES)
def test_beam_layout_keeps_one_source_memory_per_sentence(rule):
    """With fairseq's beam layout (set_beam_size), the cross-attention memory is stored once per
    sentence; decoding, beam reordering, pruning finished sentences and an order that mixes
    sentences' beams (never fairseq's, but legal) equal recomputation."""
    model, d = build_model(fw_args("dpfp", rule))
    beam, sentences = 3, 4
    model.set_beam_size(beam)
    g = torch.Generator().manual_seed(6)
    src = random_tokens(d, sentences, 7, g).repeat_interleave(beam, dim=0)  # [sentence, beam] rows
    prev = random_tokens(d, sentences * beam, 6, g)
    lengths = torch.full((sentences * beam,), 7)
    state = {}
    encoder_out = model.encoder(src, src_lengths=lengths)
    decode_step_by_step(model, prev[:, :2], encoder_out, state)
    memory = model.decoder.layers[0].encoder_attn._get_input_buffer(state)["memory"]
    assert memory.shape[0] == sentences
    # step 3: beams swap within their sentences; step 4: sentences 1 and 3 finish (pruned);
    # step 5: the two sentences' beams are mixed, so each hypothesis needs its own memory row
    within = torch.tensor([2, 0, 0, 3, 5, 4, 8, 6, 7, 11, 9, 10])
    pruned = torch.tensor([0, 1, 2, 6, 7, 8])
    mixed = torch.tensor([3, 0, 1, 4, 5, 2])
    order, tail = torch.arange(sentences * beam), []
    for t, new_order in [(2, within), (3, pruned), (4, mixed)]:
        model.decoder.reorder_incremental_state_scripting(state, new_order)
        encoder_out = model.encoder.reorder_encoder_out(encoder_out, new_order)
        order = order[new_order]
        logits, _ = model.decoder(prev[order, : t + 1], encoder_out=encoder_out,
                                  incremental_state=state)
        full, _ = model(src[order], lengths[order], prev[order, : t + 1])
        torch.testing.assert_close(logits[:, -1], full[:, -1], rtol=1e-9, atol=1e-9)
        memory = model.decoder.layers[0].encoder_attn._get_input_buffer(state)["memory"]
        assert memory.shape[0] == {2: sentences, 3: 2, 4: 6}[t]
