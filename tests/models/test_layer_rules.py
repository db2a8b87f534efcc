"""Per-layer update rules (`--fw-decoder-rule sum,delta`): each layer's block runs its own rule, decodes as it
trains, keeps its rules in the checkpoint record, and a wrong count of rules stops at parsing in one line."""
import re

import pytest
import torch

from factories import build_model, decode_step_by_step, parse_model_args, random_tokens
from fw_fairseq.models.checkpoints import RECORD, decode
from fw_fairseq.modules.fast_weight_attention import FastWeightAttention

# the sum rule in every block; a test that gives --fw-decoder-rule again overrides the decoder's (the last value wins)
FW = ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]


def rules_by_layer(stack, block):
    return [getattr(layer, block).update_rule for layer in stack.layers]


def test_each_layer_runs_its_rule():
    model, _ = build_model(FW + ["--fw-decoder-rule", "sum,delta", "--fw-encoder-rule", "gated_delta,sum"])
    assert rules_by_layer(model.decoder, "self_attn") == ["sum", "delta"]
    assert rules_by_layer(model.decoder, "encoder_attn") == ["sum", "sum"]
    assert rules_by_layer(model.encoder, "self_attn") == ["gated_delta", "sum"]
    # the delta rule's beta projection in the delta layer only
    assert [hasattr(layer.self_attn, "beta_proj") for layer in model.decoder.layers] == [False, True]


def test_one_rule_repeated_per_layer_is_that_rule():
    model, _ = build_model(FW + ["--fw-decoder-rule", "delta,delta"])
    assert rules_by_layer(model.decoder, "self_attn") == ["delta", "delta"]
    assert decode(getattr(model, RECORD))["--fw-decoder-rule"] == "delta"


@pytest.mark.parametrize("decoder_rules", ["sum,delta", "delta,gated_delta"])
@pytest.mark.parametrize("norm", ["sum", "l2"])
def test_incremental_equals_teacher_forced_with_layer_rules(decoder_rules, norm):
    model, d = build_model(FW + ["--fw-decoder-rule", decoder_rules, "--fw-delta-norm", norm])
    g = torch.Generator().manual_seed(4)
    src, prev = random_tokens(d, 3, 8, g), random_tokens(d, 3, 7, g)
    lengths = torch.full((3,), 8)
    full, _ = model(src, lengths, prev)
    stepwise = decode_step_by_step(model, prev, model.encoder(src, src_lengths=lengths))
    torch.testing.assert_close(stepwise, full, rtol=1e-9, atol=1e-9)


def test_a_layer_equals_the_same_layer_of_a_uniform_model():
    """Layer 2 of a sum,delta decoder is layer 2 of an all-delta decoder given the same weights and input."""
    mixed, _ = build_model(FW + ["--fw-decoder-rule", "sum,delta"])
    uniform, _ = build_model(FW + ["--fw-decoder-rule", "delta"])
    a, b = mixed.decoder.layers[1].self_attn, uniform.decoder.layers[1].self_attn
    assert isinstance(a, FastWeightAttention)
    b.load_state_dict(a.state_dict())
    x = torch.randn(5, 2, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))  # [T, B, C]
    torch.testing.assert_close(a(x, x, x)[0], b(x, x, x)[0], rtol=0, atol=0)


def test_the_record_keeps_the_layer_rules_and_a_load_refuses_others():
    trained, _ = build_model(FW + ["--fw-decoder-rule", "sum,delta"])
    settings = decode(getattr(trained, RECORD))
    assert settings["--fw-decoder-rule"] == "sum,delta" and settings["--fw-encoder-rule"] == "sum"
    build_model(FW + ["--fw-decoder-rule", "sum,delta"], seed=1)[0].load_state_dict(trained.state_dict())
    with pytest.raises(SystemExit, match=r"trained with --fw-decoder-rule sum,delta, not delta,sum"):
        build_model(FW + ["--fw-decoder-rule", "delta,sum"])[0].load_state_dict(trained.state_dict())


@pytest.mark.parametrize("extra,message", [
    (["--fw-decoder-rule", "sum,delta,delta"],
     "error: argument --fw-decoder-rule: 3 rules for --decoder-layers 2; allowed: one rule, or one per layer (2)"),
    (["--fw-decoder-rule", "delta,delta,delta"],
     "error: argument --fw-decoder-rule: 3 rules for --decoder-layers 2; allowed: one rule, or one per layer (2)"),
    (["--fw-encoder-rule", "sum,delta", "--encoder-layers", "3"],
     "error: argument --fw-encoder-rule: 2 rules for --encoder-layers 3; allowed: one rule, or one per layer (3)"),
])
def test_a_wrong_count_of_rules_stops_at_parsing(extra, message):
    with pytest.raises(SystemExit, match=re.escape(message)):
        parse_model_args(FW + extra)


def test_an_unknown_rule_in_the_list_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        parse_model_args(FW + ["--fw-decoder-rule", "sum,hebb"])
    err = capsys.readouterr().err
    assert "--fw-decoder-rule" in err and "allowed: sum, delta, gated_delta, delta_z, or one of them per layer" in err


def test_a_language_model_takes_a_rule_per_layer():
    from factories import build_lm

    model, _ = build_lm("transformer_lm_fw_tiny", ["--fw-decoder-rule", "delta,sum"])
    assert rules_by_layer(model.decoder, "self_attn") == ["delta", "sum"]
    with pytest.raises(SystemExit, match=re.escape("3 rules for --decoder-layers 2")):
        build_lm("transformer_lm_fw_tiny", ["--fw-decoder-rule", "delta,sum,sum"])


@pytest.mark.parametrize("block,other", [("encoder", "decoder"), ("decoder", "encoder")])
def test_kept_layers_take_their_own_rules(block, other):
    """--{block}-layers-to-keep 2,0 of a sum,delta,gated_delta stack builds layers 1 and 3 with their rules; the
    pruned checkpoint loads into it and computes what the full model computes without its layer 2, in float64.
    (fairseq's pruning drops the layers of a block without a list: the other block keeps both of its two.)"""
    from fairseq.checkpoint_utils import prune_state_dict

    stack = ["--fw-" + block + "-rule", "sum,delta,gated_delta", f"--{block}-layers", "3"]
    keep = [f"--{block}-layers-to-keep", "2,0", f"--{other}-layers-to-keep", "0,1"]
    full, d = build_model(FW + stack)
    kept, _ = build_model(FW + stack + keep, seed=1)
    assert rules_by_layer(getattr(kept, block), "self_attn") == ["sum", "gated_delta"]
    kept.load_state_dict(prune_state_dict(full.state_dict(), parse_model_args(FW + stack + keep)))
    del getattr(full, block).layers[1]
    g = torch.Generator().manual_seed(6)
    src, prev = random_tokens(d, 2, 6, g), random_tokens(d, 2, 5, g)
    lengths = torch.full((2,), 6)
    torch.testing.assert_close(kept(src, lengths, prev)[0], full(src, lengths, prev)[0], rtol=0, atol=0)


def test_a_language_model_keeps_the_rules_of_its_kept_layers():
    from factories import build_lm

    extra = ["--fw-decoder-rule", "delta,sum,gated_delta", "--decoder-layers", "3", "--decoder-layers-to-keep", "1,2"]
    model, _ = build_lm("transformer_lm_fw_tiny", extra)
    assert rules_by_layer(model.decoder, "self_attn") == ["sum", "gated_delta"]
