"""The `--fw-*` flags come from one table (fw_fairseq/modules/flag_table.py): the parser registers its rows, the
architecture families take their defaults from it, and the record and the reading of older records follow its
`recorded` and `unrecorded` columns."""
import pytest

from factories import parse_args, parse_model_args
from fw_fairseq.models import transformer_fw as architecture
from fw_fairseq.modules import flag_table
from fw_fairseq.modules.fast_weight_config import FastWeightConfig, with_later_flags

LM = ["--arch", "transformer_lm_fw_tiny"]


def test_the_parser_registers_every_row_and_only_those():
    args = vars(parse_model_args([]))
    fw_attrs = {name for name in args if name.startswith("fw_") and name != "fw_carry_state"}
    assert fw_attrs == {flag.attr for flag in flag_table.FLAGS}


@pytest.mark.parametrize("family, argv", [("translation", []), ("lm", LM)])
def test_each_family_takes_its_defaults_from_the_table(family, argv):
    args = parse_model_args([]) if family == "translation" else parse_args("language_modeling", LM)
    config = FastWeightConfig.from_args(args)
    for flag in flag_table.FLAGS:
        default = flag.defaults.get(family)
        default = default.of(args, frozenset()) if isinstance(default, flag_table.Derived) else default
        if flag.field in (None, "places") or default is None or (family == "lm" and flag.field == "dpfp_nu"):
            continue  # places: a set in the config; the tiny LM overrides nu
        assert getattr(config, flag.field) == default, flag.name


@pytest.mark.parametrize("argv, norm", [
    (["--fw-decoder-rule", "delta"], "sum"),  # the delta rule in the decoder's self-attention only
    (["--fw-decoder-rule", "sum,gated_delta"], "sum"),
    (["--fw-update-rule", "delta", "--fw-attention", "decoder"], "sum"),
    (["--fw-update-rule", "delta", "--fw-encoder-rule", "sum", "--fw-cross-rule", "sum"], "sum"),
    (["--fw-update-rule", "delta"], "l2"),  # every block
    (["--fw-encoder-rule", "delta"], "l2"),
    (["--fw-cross-rule", "gated_delta", "--fw-attention", "cross"], "l2"),
    (["--fw-update-rule", "delta", "--fw-attention", "encoder,decoder"], "l2"),
    (["--fw-update-rule", "delta", "--fw-delta-norm", "sum"], "sum"),  # given: kept
    (["--fw-decoder-rule", "delta", "--fw-delta-norm", "l2"], "l2"),
])
def test_translation_delta_norm_follows_where_the_delta_rules_are(argv, norm):
    assert parse_model_args(argv).fw_delta_norm == norm


def test_translation_defaults_to_the_delta_decoder_and_the_aligned_read():
    config = FastWeightConfig.from_args(parse_model_args([]))
    assert [config.rule(place) for place in ("encoder", "decoder", "cross")] == ["sum", "delta", "sum"]
    assert (config.delta_norm, config.cross_align) == ("sum", 4)


@pytest.mark.parametrize("argv, beta_max, decoder_conv", [
    (["--fw-feature-map", "favor"], 0.25, 3),  # FAVOR+'s translation defaults
    (["--fw-feature-map", "favor", "--fw-delta-beta-max", "1", "--fw-decoder-conv", "0"], 1, 0),  # given: kept
    (["--fw-feature-map", "favor", "--fw-decoder-conv", "5"], 0.25, 5),
    ([], 1, 0),  # DPFP-2
    (["--fw-feature-map", "hedgehog"], 1, 0),
    (LM + ["--fw-feature-map", "favor"], 1, 0),  # language models keep the others' defaults
])
def test_favor_translation_models_take_a_smaller_beta_and_the_decoder_convolution(argv, beta_max, decoder_conv):
    args = parse_args("language_modeling", argv) if argv[:1] == LM[:1] else parse_model_args(argv)
    assert (args.fw_delta_beta_max, args.fw_decoder_conv) == (beta_max, decoder_conv)


def test_args_saved_by_a_favor_model_keep_the_decoder_they_were_trained_with():
    saved = parse_model_args(["--fw-feature-map", "favor", "--fw-delta-beta-max", "1", "--fw-decoder-conv", "0"])
    architecture.transformer_fw_small(saved)  # what fairseq runs on loading it
    assert (saved.fw_delta_beta_max, saved.fw_decoder_conv) == (1, 0)
    older = parse_model_args(["--fw-feature-map", "favor", "--fw-delta-beta-max", "1"])
    del older.fw_decoder_conv  # saved before --fw-decoder-conv existed: trained without the convolution
    architecture.transformer_fw_small(older)
    assert FastWeightConfig.from_args(older).decoder_conv == 0


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_a_given_update_rule_reaches_the_decoder(rule):
    config = FastWeightConfig.from_args(parse_model_args(["--fw-update-rule", rule]))
    assert [config.rule(place) for place in ("encoder", "decoder", "cross")] == [rule] * 3


def test_args_saved_before_the_delta_decoder_default_keep_their_rule():
    # a model trained when the decoder followed --fw-update-rule saved it, and no --fw-decoder-rule
    saved = parse_model_args(["--fw-update-rule", "sum", "--fw-cross-align", "0"])
    assert saved.fw_decoder_rule is None
    architecture.transformer_fw_small(saved)  # what fairseq runs on loading it
    config = FastWeightConfig.from_args(saved)
    assert (config.rule("decoder"), config.cross_align) == ("sum", 0)
    assert config.settings()["--fw-update-rule"] == "sum"


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
                      "--fw-decoder-positions": "absolute"}  # --fw-favor-redraw: unknown, left out
