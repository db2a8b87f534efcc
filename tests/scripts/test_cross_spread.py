"""fw_research.demo.cross_spread: the decoder's cross-attention weights recomputed in float64 from the layer's
projections reproduce the layer's own read, for fast-weight and softmax cross-attention, on small untrained
models: seconds, no training."""
import pytest
import torch

from factories import build_model, random_tokens
from fw_research.demo import cross_spread

SUM = ["--fw-feature-map", "dpfp", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]
CROSS = {
    "fast weights": [*SUM, "--fw-cross-align", "0"],
    "aligned": [*SUM, "--fw-cross-align", "4"],
    "softmax": [*SUM, "--fw-attention", "encoder,decoder"],
}
# fairseq takes its softmax in float32 even in a float64 model
AGREE = {"fast weights": 1e-10, "aligned": 1e-10, "softmax": 1e-6}


def message(dictionary, source_length, seed=0):
    g = torch.Generator().manual_seed(seed)
    source, target = (random_tokens(dictionary, 1, n, g)[0] for n in (source_length, 6))
    eos = torch.tensor([dictionary.eos()])
    return torch.cat([source, eos]), torch.cat([target, eos])


@pytest.mark.parametrize("kind", CROSS)
def test_the_recomputed_weights_give_the_layers_own_read(kind):
    model, dictionary = build_model(CROSS[kind])
    for stats in cross_spread.message_stats(model, *message(dictionary, 9)):
        assert stats["check"] < AGREE[kind]
        assert 1 / 10 <= stats["spread"] <= 1 and 1 / 10 <= stats["top"] <= 1  # 10 source positions with eos


def test_weights_are_a_distribution_over_the_source():
    model, dictionary = build_model(CROSS["fast weights"])
    store = cross_spread.captured(model, cross_spread.capture, *message(dictionary, 12))
    w, v = cross_spread.weights(model.decoder.layers[0].encoder_attn, store[0]["query"], store[0]["key"])
    assert w.shape == (2, 7, 13) and v.shape == (2, 13, 16)  # [H, T, S], [H, S, D]
    assert (w >= 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 7, dtype=torch.float64), rtol=0, atol=1e-5)  # Z_EPS


def test_one_position_read_has_the_smallest_spread_and_an_even_read_the_largest():
    one = torch.zeros(1, 1, 8, dtype=torch.float64)
    one[..., 3] = 1
    spread, top = cross_spread.spread_and_top(torch.cat([one, torch.full_like(one, 1 / 8)], 1))  # [1, 2, 8]
    torch.testing.assert_close(spread, torch.tensor([[1 / 8, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(top, torch.tensor([[1.0, 1 / 8]], dtype=torch.float64))


def test_the_table_averages_the_seeds_of_a_configuration():
    def stats(top):
        return {subset: [{"spread": 0.5, "top": top + (subset == "test_long"), "check": 0.0}] for subset in
                cross_spread.SUBSETS}
    rows = {"softmax": [{"seed": 1, "stats": stats(0.2)}, {"seed": 2, "stats": stats(0.4)}]}
    assert cross_spread.table(rows).splitlines()[-1] == "| softmax | 2 | 0.300 · 1.300 | 0.500 · 0.500 |"
