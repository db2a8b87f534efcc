"""fw_research.demo.loop_reads: the decoder self-attention read recomputed in float64 from the layer's projections
equals the layer's own read, for each rule the loop diagnosis meets (sum, delta, delta_z), on small untrained
models: seconds, no training."""
import pytest
import torch

from factories import build_model, random_tokens
from fw_research.demo import loop_reads

RULES = {
    "sum": ["--fw-feature-map", "dpfp", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum"],
    "delta": ["--fw-feature-map", "dpfp", "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
              "--fw-delta-norm", "sum"],
    "delta_z": ["--fw-feature-map", "dpfp", "--fw-update-rule", "sum", "--fw-decoder-rule", "delta_z",
                "--fw-delta-norm", "sum"],
}


@pytest.mark.parametrize("rule", RULES)
def test_the_recomputed_read_is_the_layers_own(rule):
    model, dictionary = build_model(RULES[rule])
    g = torch.Generator().manual_seed(0)
    source, target = (random_tokens(dictionary, 1, n, g)[0] for n in (7, 12))
    target = torch.cat([target, torch.tensor([dictionary.eos()])])
    layers = loop_reads.analyse_reads(model, source, target, start=6, end=12)
    for stats in layers:
        assert stats["check_max_abs_diff"] < 1e-10
        assert ("normaliser" in stats) == (rule != "delta")
        assert ("key_fill" in stats) == (rule == "delta_z")
    if rule == "delta_z":  # z . phi(k) after the write: between 0 (nothing written) and 1 (the slot is full)
        fill = layers[0]["key_fill"]["loop"]
        assert 0 < fill < 1
