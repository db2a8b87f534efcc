"""The `--fw-*` flags come from one table (fw_fairseq/modules/flag_table.py) and their defaults from its presets:
the parser registers its rows, the architectures fill each flag without a value from their preset, FastWeightConfig
reads the args once per model, and the record and the reading of older records follow the rows' `recorded` and
`unrecorded` columns. Only values decide: a flag given its preset's value builds what leaving it out builds."""
import re
from types import SimpleNamespace

import pytest
import torch
from fairseq.models import ARCH_MODEL_REGISTRY

from factories import build_lm, build_model, make_dictionary, parse_args, parse_model_args, random_tokens
from fw_fairseq.models import transformer_fw as architecture
from fw_fairseq.models.checkpoints import RECORD, decode
from fw_fairseq.modules import flag_table
from fw_fairseq.modules.fast_weight_config import FastWeightConfig, with_later_flags

PLACES = ("encoder", "decoder", "cross")
LM_TINY = ["--arch", "transformer_lm_fw_tiny"]


def rules(config):
    return [config.rule(place) for place in PLACES]


def test_the_parser_registers_every_row_and_only_those():
    args = vars(parse_model_args([]))
    fw_attrs = {name for name in args if name.startswith("fw_") and name != "fw_carry_state"}
    assert fw_attrs == {flag.attr for flag in flag_table.FLAGS}


@pytest.mark.parametrize("preset, args", [("translation", lambda: parse_model_args([])),
                                          ("paper", lambda: parse_model_args(["--fw-preset", "paper"])),
                                          ("lm", lambda: parse_args("language_modeling", LM_TINY))])
def test_each_preset_gives_its_table_values(preset, args):
    args = args()
    assert args.fw_preset == preset
    for flag in flag_table.FLAGS:
        value = flag_table.PRESETS[preset].get(flag.name)
        if isinstance(value, flag_table.Derived) or (preset == "lm" and flag.name == "--fw-dpfp-nu"):
            continue  # the tiny LM's architecture sets nu
        if flag.name != "--fw-preset":
            assert getattr(args, flag.attr) == value, flag.name


def test_the_presets_blocks():
    translation = FastWeightConfig.from_args(parse_model_args([]))
    assert rules(translation) == ["sum", "delta", "sum"]
    assert (translation.delta_norm, translation.cross_align, translation.encoder_conv) == ("sum", 4, 3)
    paper = FastWeightConfig.from_args(parse_model_args(["--fw-preset", "paper", "--fw-feature-map", "favor"]))
    assert rules(paper) == ["sum"] * 3
    assert (paper.cross_align, paper.encoder_conv, paper.decoder_conv, paper.favor_redraw) == (0, 0, 0, "batch")
    lm = FastWeightConfig.from_args(parse_args("language_modeling", LM_TINY))
    assert (lm.places, lm.rule("decoder"), lm.delta_norm) == ({"decoder"}, "delta", "sum")


@pytest.mark.parametrize("argv, norm", [
    (["--fw-decoder-rule", "sum,gated_delta"], "sum"),  # a delta rule in the decoder's self-attention only
    (["--fw-update-rule", "delta", "--fw-attention", "decoder"], "sum"),
    (["--fw-update-rule", "delta", "--fw-encoder-rule", "sum", "--fw-cross-rule", "sum"], "sum"),
    (["--fw-update-rule", "delta"], "l2"),  # every block
    (["--fw-encoder-rule", "delta"], "l2"),
    (["--fw-cross-rule", "gated_delta", "--fw-attention", "cross"], "l2"),
    (["--fw-update-rule", "delta", "--fw-attention", "encoder,decoder"], "l2"),
    (["--fw-update-rule", "delta", "--fw-delta-norm", "sum"], "sum"),  # given: kept
    (["--fw-preset", "paper", "--fw-update-rule", "delta"], "sum"),  # the paper's delta rule
])
def test_translation_delta_norm_follows_where_the_delta_rules_are(argv, norm):
    assert parse_model_args(argv).fw_delta_norm == norm


@pytest.mark.parametrize("argv, beta_max, decoder_conv", [
    (["--fw-feature-map", "favor"], 0.25, 3),  # the translation preset's FAVOR+ values
    (["--fw-feature-map", "favor", "--fw-delta-beta-max", "1", "--fw-decoder-conv", "0"], 1, 0),  # given: kept
    (["--fw-feature-map", "favor", "--fw-decoder-conv", "5"], 0.25, 5),
    ([], 1, 0),  # DPFP-2
    (["--fw-feature-map", "hedgehog"], 1, 0),
    (["--fw-preset", "paper", "--fw-feature-map", "favor"], 1, 0),
    (LM_TINY + ["--fw-feature-map", "favor"], 1, 0),  # language models keep the others' values
])
def test_favor_translation_models_take_a_smaller_beta_and_the_decoder_convolution(argv, beta_max, decoder_conv):
    args = parse_args("language_modeling", argv) if argv[:1] == LM_TINY[:1] else parse_model_args(argv)
    assert (args.fw_delta_beta_max, args.fw_decoder_conv) == (beta_max, decoder_conv)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_the_update_rule_leaves_the_translation_decoder_its_preset_rule(rule):
    assert rules(FastWeightConfig.from_args(parse_model_args(["--fw-update-rule", rule]))) == [rule, "delta", rule]
    paper = parse_model_args(["--fw-preset", "paper", "--fw-update-rule", rule])
    assert rules(FastWeightConfig.from_args(paper)) == [rule] * 3


def saved_by_older_code(argv, **attrs):
    """Args as a checkpoint from before the presets holds them: every value resolved but no --fw-preset, a per-block
    rule that followed --fw-update-rule None."""
    saved = parse_model_args(argv)
    del saved.fw_preset
    for name, value in attrs.items():
        setattr(saved, name, value)
    return saved


def test_args_saved_with_the_update_rule_given_build_that_rule_in_the_decoder():
    # fairseq builds the model from the args in the checkpoint; an older translation model given --fw-update-rule
    # sum had the sum rule in its decoder too, and saved no --fw-decoder-rule
    saved = saved_by_older_code(["--fw-update-rule", "sum", "--fw-cross-align", "0"], fw_decoder_rule=None)
    dictionary = make_dictionary()
    torch.manual_seed(0)
    model = ARCH_MODEL_REGISTRY[saved.arch].build_model(saved, SimpleNamespace(source_dictionary=dictionary,
                                                                               target_dictionary=dictionary))
    assert [layer.self_attn.update_rule for layer in model.decoder.layers] == ["sum", "sum"]
    record = decode(getattr(model, RECORD))
    assert (record["--fw-update-rule"], record["--fw-cross-align"], record["--fw-encoder-conv"]) == ("sum", "0", "3")
    trained, _ = build_model(["--fw-preset", "paper", "--fw-cross-align", "0", "--fw-encoder-conv", "3"], seed=1)
    model.load_state_dict(trained.state_dict())  # the same attention: the record check passes


def test_args_saved_by_a_favor_model_keep_the_decoder_they_were_trained_with():
    saved = saved_by_older_code(["--fw-feature-map", "favor", "--fw-delta-beta-max", "1", "--fw-decoder-conv", "0"])
    architecture.transformer_fw_small(saved)  # what fairseq runs on loading it
    assert (saved.fw_delta_beta_max, saved.fw_decoder_conv) == (1, 0)
    older = saved_by_older_code(["--fw-feature-map", "favor", "--fw-delta-beta-max", "1"])
    del older.fw_decoder_conv  # saved before --fw-decoder-conv existed: trained without the convolution
    architecture.transformer_fw_small(older)
    assert FastWeightConfig.from_args(older).decoder_conv == 0


def test_a_flag_missing_from_older_args_takes_its_before_value():
    saved = parse_model_args(["--fw-feature-map", "favor"])
    for flag in flag_table.FLAGS:
        if flag.before is not None:
            delattr(saved, flag.attr)
    config = FastWeightConfig.from_args(saved)
    assert (config.delta_norm, config.favor_redraw, config.encoder_conv, config.output_gate) == ("sum", "batch", 0,
                                                                                                  "none")


def test_later_flags_fill_only_what_the_table_knows():
    old = {"--fw-attention": "encoder,decoder,cross", "--fw-feature-map": "favor", "--fw-update-rule": "delta",
           "--fw-favor-features": "8"}
    filled = with_later_flags(old)
    assert filled == {**old, "--fw-delta-norm": "sum", "--fw-delta-beta-max": "1", "--fw-output-gate": "none",
                      "--fw-encoder-conv": "0", "--fw-decoder-conv": "0", "--fw-cross-align": "0",
                      "--fw-decoder-positions": "absolute", "--fw-align-ratio": "1",
                      "--fw-align-free-heads": "0"}  # --fw-favor-redraw: unknown


@pytest.mark.parametrize("attr, value, message", [
    ("fw_feature_map", "relu", "argument --fw-feature-map: invalid choice: 'relu' (choose from 'elu'"),
    ("fw_delta_beta_max", 3, "argument --fw-delta-beta-max: --fw-delta-beta-max got '3'; allowed: a number in"),
    ("fw_decoder_rule", "sum,hebb", "argument --fw-decoder-rule: --fw-decoder-rule got 'sum,hebb'; allowed: sum"),
    ("fw_encoder_conv", 4, "allowed: 0 (off) or an odd width >= 3"),
    ("fw_preset", "wmt", "argument --fw-preset: invalid choice: 'wmt' (choose from 'translation', 'paper', 'lm')"),
])
def test_args_that_did_not_come_through_the_parser_are_checked_by_the_same_rows(attr, value, message):
    saved = parse_model_args([])
    setattr(saved, attr, value)
    with pytest.raises(SystemExit, match=r"^[^\n]*: error: [^\n]*" + re.escape(message) + r"[^\n]*$"):
        FastWeightConfig.from_args(saved) if attr != "fw_preset" else architecture.transformer_fw(saved)


def test_the_config_is_made_once_per_model(monkeypatch):
    calls = []
    from_args = FastWeightConfig.from_args.__func__
    monkeypatch.setattr(FastWeightConfig, "from_args",
                        classmethod(lambda cls, args: calls.append(1) or from_args(cls, args)))
    build_model(["--fw-decoder-rule", "sum,delta"])
    assert len(calls) == 1
    build_lm("transformer_lm_fw_tiny")
    assert len(calls) == 2
    assert not any(isinstance(value, FastWeightConfig) for value in vars(parse_model_args([])).values())


def given_text(value):
    return str(int(value)) if isinstance(value, bool) else str(value)


def explicit_defaults(args):
    """Every --fw-* flag given the value its preset gave it (a per-block rule following --fw-update-rule: that)."""
    config = FastWeightConfig.from_args(args)
    argv = []
    for flag in flag_table.FLAGS:
        place = flag.name[len("--fw-"):-len("-rule")] if flag.field is None and flag.name != "--fw-preset" else None
        value = ",".join(config.rules(place)) if place else getattr(args, flag.attr)
        argv.append([flag.name, given_text(value)])
    return argv


def same_model(a, b):
    assert decode(getattr(a, RECORD)) == decode(getattr(b, RECORD))
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    tokens = random_tokens(a.decoder.dictionary, 2, 6, torch.Generator().manual_seed(3))
    lengths = torch.full((2,), 6)
    if hasattr(a, "encoder"):
        torch.testing.assert_close(a(tokens, lengths, tokens)[0], b(tokens, lengths, tokens)[0], rtol=0, atol=0)
    else:
        torch.testing.assert_close(a(tokens)[0], b(tokens)[0], rtol=0, atol=0)


@pytest.mark.parametrize("base", [[], ["--fw-feature-map", "favor", "--fw-favor-features", "8"],
                                  ["--fw-preset", "paper"], ["--fw-update-rule", "delta"]])
def test_a_translation_flag_given_its_default_builds_the_same_model(base):
    plain, _ = build_model(base)
    flags = explicit_defaults(parse_model_args(base))
    for given in [*flags, [text for flag in flags for text in flag]]:  # each alone, then all together
        model, _ = build_model(base + given)
        same_model(plain, model)


@pytest.mark.parametrize("arch", ["transformer_lm_fw_tiny", "transformer_lm_fw_wt103_small"])
def test_a_language_model_flag_given_its_default_builds_the_same_model(arch):
    small = ["--decoder-layers", "2"] if arch.endswith("small") else []
    plain, _ = build_lm(arch, small)
    flags = explicit_defaults(parse_args("language_modeling", ["--arch", arch, *small]))
    for given in [*flags, [text for flag in flags for text in flag]]:
        model, _ = build_lm(arch, small + given)
        same_model(plain, model)


def test_an_update_rule_given_sum_builds_the_same_translation_model():
    plain, _ = build_model([])
    given, _ = build_model(["--fw-update-rule", "sum"])
    same_model(plain, given)
