"""The comparison's configurations are fairseq command lines under every preset: each parses with fairseq's own
parser, and a per-layer rule is spelled for the preset's count of decoder layers."""
import pytest

from factories import parse_args
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_research.experiments.attention_configs import CONFIGS, PLAIN_READ, PRESETS, config_flags, model_flags


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_configuration_parses_under_every_preset(preset, config):
    args = parse_args("translation", model_flags(preset, config, seed=1))
    assert args.seed == 1 and args.arch == "transformer_fw_small"


def test_a_per_layer_rule_follows_the_presets_decoder_layers():
    def decoder_rule(preset, config):
        flags = config_flags(preset, config)
        return flags[flags.index("--fw-decoder-rule") + 1]

    assert decoder_rule("demo", "dpfp2-sum-delta-dec-l2-vconv3") == "sum,delta"
    assert decoder_rule("base", "dpfp2-sum-delta-dec-l2-vconv3") == "sum,delta,delta"
    assert decoder_rule("base", "dpfp2-delta-sum-dec-l2-vconv3") == "delta,delta,sum"
    assert config_flags("demo", "dpfp2-sum-vconv3") == CONFIGS["dpfp2-sum-vconv3"][1] + PLAIN_READ


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_every_row_names_its_rules_its_read_of_the_source_and_favors_decoder(config):
    """The translation models' defaults do not decide a row: its decoder's rule (the one it names, else its
    --fw-update-rule), its cross-attention's read and a FAVOR+ row's beta bound and decoder convolution are
    those its flags name."""
    args = parse_args("translation", model_flags("demo", config, seed=1))
    flags = config_flags("demo", config)
    if CONFIGS[config][0] != "softmax":
        named = flags[flags.index("--fw-update-rule") + 1]
        decoder = flags[flags.index("--fw-decoder-rule") + 1] if "--fw-decoder-rule" in flags else named
        assert flags.count("--fw-decoder-rule") <= 1
        assert args.fw_update_rule == named and args.fw_decoder_rule == decoder
        assert flags.count("--fw-cross-align") == 1
        assert args.fw_cross_align == int(flags[flags.index("--fw-cross-align") + 1])
    if "favor" in flags:  # a FAVOR+ row its beta's bound and decoder convolution, which FAVOR+'s defaults set apart
        assert flags.count("--fw-delta-beta-max") == flags.count("--fw-decoder-conv") == 1
        assert args.fw_delta_beta_max == float(flags[flags.index("--fw-delta-beta-max") + 1])
        assert args.fw_decoder_conv == int(flags[flags.index("--fw-decoder-conv") + 1])


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("config", sorted(name for name in CONFIGS if "sum" in name.split("-")
                                          and not {"delta", "deltaz", "gated"} & set(name.split("-"))))
def test_a_sum_row_builds_the_sum_rule_in_every_fast_weight_block(preset, config):
    args = parse_args("translation", model_flags(preset, config, seed=1))
    assert FastWeightConfig.from_args(args).settings()["--fw-update-rule"] == "sum"
