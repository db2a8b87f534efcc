"""Padding, option validation, FAVOR+ buffers and mixed precision of transformer_fw."""
import re

import pytest
import torch

from factories import build_model, parse_model_args, random_tokens

FW = ["--fw-dpfp-nu", "2", "--fw-favor-features", "24"]


@pytest.mark.parametrize("feature_map,rule", [("elu", "sum"), ("dpfp", "delta"), ("favor", "sum"),
                                              ("favor", "delta"), ("dpfp", "gated_delta")])
def test_left_padded_batch_equals_each_sentence_alone(feature_map, rule):
    model, d = build_model(FW + ["--fw-feature-map", feature_map, "--fw-update-rule", rule, "--fw-decoder-rule", rule])
    g = torch.Generator().manual_seed(0)
    lengths = [7, 4, 2]
    sentences = [random_tokens(d, 1, n, g)[0] for n in lengths]
    prev = random_tokens(d, 3, 5, g)
    src = torch.full((3, max(lengths)), d.pad())
    for i, s in enumerate(sentences):
        src[i, max(lengths) - len(s):] = s  # fairseq pads sources on the left
    batched, _ = model(src, torch.tensor(lengths), prev)
    for i, s in enumerate(sentences):
        alone, _ = model(s[None], torch.tensor([len(s)]), prev[i: i + 1])
        torch.testing.assert_close(batched[i: i + 1], alone, rtol=1e-9, atol=1e-9)


def test_right_padded_targets_do_not_touch_real_positions():
    model, d = build_model(FW + ["--fw-feature-map", "dpfp", "--fw-update-rule", "delta"])
    g = torch.Generator().manual_seed(1)
    src, prev = random_tokens(d, 2, 6, g), random_tokens(d, 2, 6, g)
    padded = prev.clone()
    padded[1, 3:] = d.pad()
    full, _ = model(src, torch.full((2,), 6), prev)
    with_pad, _ = model(src, torch.full((2,), 6), padded)
    torch.testing.assert_close(with_pad[1, :3], full[1, :3], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("flag,value,allowed", [
    ("--fw-feature-map", "relu", "elu"),
    ("--fw-update-rule", "hebb", "'sum', 'delta', 'gated_delta'"),
    ("--fw-delta-beta-max", "3", "allowed: a number in (0, 2]"),
    ("--fw-delta-beta-max", "0", "allowed: a number in (0, 2]"),
    ("--fw-delta-beta-max", "nan", "allowed: a number in (0, 2]"),
    ("--fw-attention", "encoder,ffn", "encoder,decoder,cross"),
    ("--fw-favor-features", "0", ">= 1"),
    ("--fw-dpfp-nu", "-1", ">= 1"),
    ("--fw-decoder-rule", "hebb", "allowed: sum, delta, gated_delta"),
    ("--fw-cross-rule", "", "allowed: sum, delta, gated_delta"),
    ("--fw-delta-norm", "max", "'sum', 'l2'"),
    ("--fw-beta-bias", "high", "invalid float value"),
    ("--fw-favor-redraw", "sometimes", "'batch', 'never'"),
    ("--fw-output-gate", "tanh", "allowed: none, channel, head or rms, each optionally followed by :LIST"),
    ("--fw-output-gate", "channel:ffn", "a comma-separated subset of encoder,decoder,cross"),
    ("--fw-output-gate", "none:cross", "allowed: none, channel, head or rms"),
    ("--fw-encoder-conv", "4", "allowed: 0 (off) or an odd width >= 3"),
    ("--fw-encoder-conv", "wide", "allowed: 0 (off) or an odd width >= 3"),
    ("--fw-decoder-conv", "-1", "allowed: an integer >= 0"),
    ("--fw-cross-align", "-1", "allowed: an integer >= 0"),
    ("--fw-cross-align", "two", "allowed: an integer >= 0"),
    ("--fw-align-free-heads", "-1", "allowed: an integer >= 0"),
])
def test_bad_flags_are_rejected_at_parsing(flag, value, allowed, capsys):
    with pytest.raises(SystemExit):
        parse_model_args([flag, value])
    err = capsys.readouterr().err
    assert flag in err and allowed in err


@pytest.mark.parametrize("extra,message", [
    # d_key = 32 / 2 = 16 here, so nu may be at most 31
    (["--fw-dpfp-nu", "32"], "error: argument --fw-dpfp-nu: 32 is too large for encoder attention "
     "(d_key = --encoder-embed-dim 32 / --encoder-attention-heads 2 = 16); allowed: 1..31"),
    (["--fw-dpfp-nu", "32", "--fw-attention", "cross", "--encoder-embed-dim", "64"],
     "error: argument --fw-dpfp-nu: 32 is too large for cross attention (d_key = "
     "--decoder-embed-dim 32 / --decoder-attention-heads 2 = 16); allowed: 1..31"),
    (["--decoder-attention-heads", "3"], "error: argument --decoder-attention-heads: 3 heads do "
     "not divide --decoder-embed-dim 32; allowed: a divisor of 32"),
    (["--fw-align-free-heads", "2"], "error: argument --fw-align-free-heads: 2 free heads leave none of "
     "--decoder-attention-heads 2 with the prior; allowed: 0..1"),
    (["--fw-align-free-heads", "1", "--fw-cross-align", "0"], "error: argument --fw-align-free-heads: 1 heads free "
     "of a prior that --fw-cross-align 0 turns off; allowed with --fw-cross-align 0: 0"),
])
def test_shape_errors_stop_at_parsing(extra, message):
    """fairseq runs the architecture while parsing: these exit there, in argparse's format."""
    with pytest.raises(SystemExit, match=re.escape(message)):
        parse_model_args(["--fw-feature-map", "dpfp"] + extra)


def test_fw_attention_none_is_the_standard_transformer():
    from fairseq.modules import MultiheadAttention

    model, _ = build_model(["--fw-attention", "none"])
    attentions = [m for m in model.modules() if isinstance(m, MultiheadAttention)]
    assert len(attentions) == 2 + 2 * 2  # 2 encoder self, 2 decoder self + 2 cross


def test_model_help_documents_the_flags():
    # fairseq's --help exits before any model adds its flags (true for its own archs too), so
    # check the help text of the model's own argument group.
    import argparse

    from fw_fairseq.models.transformer_fw import FastWeightTransformerModel

    parser = argparse.ArgumentParser()
    FastWeightTransformerModel.add_args(parser)
    out = parser.format_help()
    for flag in ["--fw-feature-map", "--fw-update-rule", "--fw-dpfp-nu", "--fw-favor-features",
                 "--fw-attention", "--fw-delta-beta-max"]:
        assert flag in out
    words = " ".join(out.split())  # argparse wraps the help text at the terminal's width
    assert "gated_delta" in words and "alpha starts near 1" in words


def test_favor_projection_is_saved_redrawn_in_training_fixed_in_eval():
    model, d = build_model(FW + ["--fw-feature-map", "favor", "--fw-favor-redraw", "batch"])
    names = [k for k in model.state_dict() if k.endswith("favor.projection")]
    assert len(names) == 2 * 1 + 2 * 2  # every fast-weight attention block has its own R
    g = torch.Generator().manual_seed(2)
    src, prev = random_tokens(d, 2, 5, g), random_tokens(d, 2, 4, g)
    before = {k: model.state_dict()[k].clone() for k in names}
    model(src, torch.full((2,), 5), prev)  # eval: no redraw
    assert all(torch.equal(before[k], model.state_dict()[k]) for k in names)
    model.train()
    model(src, torch.full((2,), 5), prev)
    after = model.state_dict()
    assert all(not torch.equal(before[k], after[k]) for k in names)
    # independently per layer: no two layers share a draw
    draws = [after[k] for k in names]
    assert all(not torch.equal(draws[0], other) for other in draws[1:])


def test_favor_redraw_never_keeps_the_initial_features_in_training():
    model, d = build_model(FW + ["--fw-feature-map", "favor", "--fw-favor-redraw", "never"])
    names = [k for k in model.state_dict() if k.endswith("favor.projection")]
    before = {k: model.state_dict()[k].clone() for k in names}
    g = torch.Generator().manual_seed(2)
    model.train()
    model(random_tokens(d, 2, 5, g), torch.full((2,), 5), random_tokens(d, 2, 4, g))
    assert all(torch.equal(before[k], model.state_dict()[k]) for k in names)


def test_favor_keeps_its_features_by_default_for_translation_and_redraws_them_for_checkpoints_from_before():
    """transformer_fw*'s default is never (0.97x softmax BLEU against 0.74x redrawing, README); args saved
    before --fw-favor-redraw existed trained with a redraw every batch, and keep it."""
    from fw_fairseq.modules.fast_weight_config import set_fast_weight_defaults

    assert parse_model_args(FW + ["--fw-feature-map", "favor"]).fw_favor_redraw == "never"
    saved = parse_model_args(FW + ["--fw-feature-map", "favor"])
    del saved.fw_favor_redraw
    set_fast_weight_defaults(saved, "translation")
    assert saved.fw_favor_redraw == "batch"


@pytest.mark.parametrize("feature_map", ["favor", "dpfp"])
def test_bf16_autocast_keeps_state_in_fp32_and_finite(feature_map):
    model, d = build_model(FW + ["--fw-feature-map", feature_map], dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    src, prev = random_tokens(d, 2, 6, g), random_tokens(d, 2, 5, g)
    encoder_out = model.encoder(src, src_lengths=torch.full((2,), 6))
    state = {}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, _ = model(src, torch.full((2,), 6), prev)
        model.decoder(prev[:, :1], encoder_out=encoder_out, incremental_state=state)
    assert torch.isfinite(logits).all()
    # the states (not the memory's hypothesis -> row index, nor the aligned read's counts of steps and weight columns
    # or its float64 source lengths, nor the decoder convolution's last values, FAVOR+'s default, kept as the
    # projection gives them: a window of inputs, not a sum over the steps)
    cached = [v for buf in state.values() for key, v in buf.items()
              if torch.is_tensor(v) and v.is_floating_point() and not key.startswith("align_") and key != "conv_tail"]
    assert cached and all(v.dtype == torch.float32 for v in cached)


@pytest.mark.parametrize("attention", ["none", "all"])
def test_a_forward_after_a_beam_search_reads_every_sentences_source(attention):
    # fairseq's generator (as --eval-bleu runs it during training) sets the beam size and leaves it set; softmax
    # cross-attention would then keep every second source of the next teacher-forced batch
    model, d = build_model(FW + ["--fw-attention", attention])
    g = torch.Generator().manual_seed(0)
    src, prev = random_tokens(d, 3, 6, g), random_tokens(d, 3, 5, g)
    expected, _ = model(src, torch.full((3,), 6), prev)
    model.set_beam_size(2)
    got, _ = model(src, torch.full((3,), 6), prev)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
