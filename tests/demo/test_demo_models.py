"""The demo trains the shipped defaults: its last row builds the same attention as the translation models' defaults,
with the criterion they are trained with, and its sum-rule row the attention that the flags naming the paper's rule
and read give (the demo preset's architecture)."""
import pytest

from factories import parse_args
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_research.demo import demo
from fw_research.experiments.attention_configs import PRESETS, config_flags

# what a user types for each row on top of the defaults
DEFAULT_SPELLING = {"dpfp2-sum-vconv3": ["--fw-update-rule", "sum", "--fw-decoder-rule", "sum",
                                         "--fw-cross-align", "0"],
                    "dpfp2-delta-dec-align4-ul2-vconv3": []}


def settings(flags):
    arch = PRESETS["demo"][1]
    return FastWeightConfig.from_args(parse_args("translation", [*arch, *flags])).settings()


@pytest.mark.parametrize("name", [name for name in demo.MODELS if name != "softmax"])
def test_each_fast_weight_row_of_the_demo_is_the_default(name):
    assert settings(config_flags("demo", name)) == settings(DEFAULT_SPELLING[name])


def test_the_default_row_trains_with_the_unlikelihood_criterion_at_its_default_weight():
    flags = config_flags("demo", demo.MODELS[-1])
    args = parse_args("translation", [*PRESETS["demo"][1], *flags])
    plain = parse_args("translation", [*PRESETS["demo"][1], "--criterion", "fw_unlikelihood"])
    assert args.criterion == "fw_unlikelihood" and args.unlikelihood_alpha == plain.unlikelihood_alpha


def test_the_l2_delta_row_is_not_the_default():
    assert settings(config_flags("demo", "dpfp2-delta-dec-l2-vconv3")) != settings(["--fw-decoder-rule", "delta"])
