"""fw_research.demo.feature_spread: the share of one feature in phi and the delta rule's step per write, on small
untrained models: seconds, no training."""
import pytest
import torch

from factories import build_model, random_tokens
from fw_fairseq.ops.maps.factory import feature_map
from fw_research.demo import feature_spread

DEFAULTS = []  # the translation defaults: DPFP-2, the delta rule in the decoder (sum-normalised), the aligned read


def message(dictionary, seed=0):
    g = torch.Generator().manual_seed(seed)
    source, target = (random_tokens(dictionary, 1, n, g)[0] for n in (9, 6))
    eos = torch.tensor([dictionary.eos()])
    return torch.cat([source, eos]), torch.cat([target, eos])


def stats_of(extra):
    model, dictionary = build_model(extra)
    store = feature_spread.captured(model, feature_spread.capture, *message(dictionary))
    return {(block, i): feature_spread.block_stats(attn, *store[(block, i)])
            for block, i, attn in feature_spread.attentions(model)}


def test_one_feature_has_share_one_and_an_even_phi_one_over_its_width():
    phi = torch.tensor([[0.0, 3.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(feature_spread.share(phi), torch.tensor([1.0, 0.25], dtype=torch.float64))


def test_every_fast_weight_block_is_measured_and_softmax_blocks_are_not():
    assert set(stats_of(DEFAULTS)) == {(b, i) for b in feature_spread.BLOCKS for i in (0, 1)}
    assert set(stats_of(["--fw-attention", "encoder,decoder"])) == {(b, i) for b in ("encoder", "decoder")
                                                                    for i in (0, 1)}


def test_only_the_delta_decoder_has_a_step_and_it_is_beta_times_its_keys_share():
    stats = stats_of(DEFAULTS)
    assert all(("step" in s) == (block == "decoder") for (block, _), s in stats.items())
    for i in (0, 1):
        s = stats[("decoder", i)]
        assert 0 < s["step"] < s["beta"] < 1 and 0 < s["k"] <= 1  # sum-normalised: step = mean(beta * share)


def test_with_l2_normalised_phi_the_step_is_beta_itself():
    stats = stats_of(["--fw-delta-norm", "l2"])
    for i in (0, 1):
        assert stats[("decoder", i)]["step"] == pytest.approx(stats[("decoder", i)]["beta"], rel=1e-12)


def test_favor_features_of_a_longer_input_gather_on_fewer_features():
    favor = feature_map("favor", 16, m=64, fixed=True)
    x = torch.nn.functional.normalize(torch.randn(200, 16, generator=torch.Generator().manual_seed(0),
                                                  dtype=torch.float64), dim=-1)
    shares = [float(feature_spread.share(favor(x * norm, is_query=False)).mean()) for norm in (1.0, 4.0, 16.0)]
    assert shares[0] < 0.05 < shares[1] < shares[2] and shares[2] > 0.5


def test_the_table_gives_each_layer_and_averages_the_seeds():
    def stats(k):
        return {"decoder 0": {"q": 0.1, "k": k, "beta": 0.5, "step": k / 2}, "decoder 1": {"q": 0.3, "k": 0.4},
                "cross 0": {"q": 0.2, "k": 0.2}}
    rows = {"favor": [{"seed": 1, "stats": stats(0.8)}, {"seed": 2, "stats": stats(0.6)}]}
    assert feature_spread.table(rows).splitlines()[-1] == (
        "| favor | 2 | – · – | 0.100 / 0.300 · 0.700 / 0.400 | 0.200 · 0.200 | 0.500 / – · 0.350 / – |")


@pytest.mark.parametrize("extra, words", [([], "no such file"), (["--messages", "0"], "--messages 0: at least 1")])
def test_a_missing_results_file_or_no_messages_is_one_line(tmp_path, capsys, extra, words):
    results = tmp_path / "results.json"
    if extra:
        results.write_text('{"runs": [], "configs": {}}')
    with pytest.raises(SystemExit) as stop:
        feature_spread.main(["--work-dir", str(tmp_path), "--results", str(results), *extra])
    assert stop.value.code == 2 and words in capsys.readouterr().err.splitlines()[-1]
