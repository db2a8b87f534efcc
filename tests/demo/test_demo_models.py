"""The demo trains the shipped defaults: each of its fast-weight rows builds the same attention as the translation
models' defaults with no more than the flag that names the row's rule (the demo preset's architecture)."""
import pytest

import demo
from factories import parse_args
from fw_fairseq.experiments.attention_configs import PRESETS, config_flags
from fw_fairseq.modules.fast_weight_config import FastWeightConfig

# what a user types for each row on top of the defaults
DEFAULT_SPELLING = {"dpfp2-sum-vconv3": [], "dpfp2-delta-dec-vconv3": ["--fw-decoder-rule", "delta"]}


def settings(flags):
    arch = PRESETS["demo"][1]
    return FastWeightConfig.from_args(parse_args("translation", [*arch, *flags])).settings()


@pytest.mark.parametrize("name", [name for name in demo.MODELS if name != "softmax"])
def test_each_fast_weight_row_of_the_demo_is_the_default(name):
    assert settings(config_flags("demo", name)) == settings(DEFAULT_SPELLING[name])


def test_the_l2_delta_row_is_not_the_default():
    assert settings(config_flags("demo", "dpfp2-delta-dec-l2-vconv3")) != settings(["--fw-decoder-rule", "delta"])
