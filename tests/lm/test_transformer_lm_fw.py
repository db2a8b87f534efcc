"""transformer_lm_fw: architectures, incremental decoding, and the carried fast-weight state."""
import pytest
import torch

from factories import build_lm, decode_step_by_step, random_tokens
from fw_fairseq.models.transformer_lm_fw import CarriedState
from fw_fairseq.modules.fast_weight_attention import FastWeightAttention

SMALL = ["--decoder-layers", "2", "--decoder-embed-dim", "32", "--decoder-attention-heads", "2",
         "--decoder-ffn-embed-dim", "48"]
RULES = [("elu", "delta"), ("dpfp", "sum"), ("favor", "delta"), ("dpfp", "gated_delta")]


def fw(feature_map, rule):
    return ["--fw-feature-map", feature_map, "--fw-update-rule", rule,
            "--fw-favor-features", "12"]


def test_wt103_small_architecture_is_the_papers():
    model, _ = build_lm("transformer_lm_fw_wt103_small", dtype=torch.float32)
    layers = model.decoder.layers
    attn = layers[0].self_attn
    assert len(layers) == 16 and model.decoder.embed_dim == 128
    assert isinstance(attn, FastWeightAttention) and attn.num_heads == 8 and attn.head_dim == 16
    assert attn.feature_map == "elu" and attn.update_rule == "delta"
    assert layers[0].fc1.out_features == 2048 and layers[0].encoder_attn is None


def test_fw_attention_none_is_softmax():
    model, _ = build_lm("transformer_lm_fw_tiny", ["--fw-attention", "none"])
    assert not isinstance(model.decoder.layers[0].self_attn, FastWeightAttention)


@pytest.mark.parametrize("feature_map,rule", RULES)
def test_incremental_equals_full_forward(feature_map, rule):
    model, d = build_lm("transformer_lm_fw_tiny", SMALL + fw(feature_map, rule))
    tokens = random_tokens(d, 3, 8, torch.Generator().manual_seed(1))
    full, _ = model(tokens)
    torch.testing.assert_close(decode_step_by_step(model, tokens), full, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("feature_map,rule", [r for r in RULES if r[0] != "favor"])
def test_carried_state_equals_concatenated_sequence(feature_map, rule):
    model, d = build_lm("transformer_lm_fw_tiny",
                        SMALL + fw(feature_map, rule) + ["--no-token-positional-embeddings"])
    tokens = random_tokens(d, 2, 12, torch.Generator().manual_seed(2))
    full, _ = model(tokens)
    state = CarriedState()
    segments = [model(part, fw_state=state)[0] for part in tokens.split([5, 4, 3], dim=1)]
    torch.testing.assert_close(torch.cat(segments, dim=1), full, rtol=1e-9, atol=1e-9)


def test_carried_state_is_detached_and_truncates_backprop():
    model, d = build_lm("transformer_lm_fw_tiny", SMALL + ["--no-token-positional-embeddings"])
    model.train()
    tokens = random_tokens(d, 2, 8, torch.Generator().manual_seed(3))
    state = CarriedState()
    model(tokens[:, :4], fw_state=state)
    saved = [t for buf in state.incremental_state.values() for t in buf.values()]
    assert saved and all(not t.requires_grad for t in saved)
    logits, _ = model(tokens[:, 4:], fw_state=state)
    logits.sum().backward()  # would fail ("backward through the graph a second time") otherwise


def test_carry_state_refuses_absolute_positions_and_favor_training():
    model, d = build_lm("transformer_lm_fw_tiny", SMALL)
    tokens = random_tokens(d, 1, 4, torch.Generator().manual_seed(4))
    with pytest.raises(ValueError, match="no-token-positional-embeddings"):
        model(tokens, fw_state=CarriedState())
    model, _ = build_lm("transformer_lm_fw_tiny",
                        SMALL + fw("favor", "sum") + ["--no-token-positional-embeddings"])
    with pytest.raises(ValueError, match="favor"):
        model.train()(tokens, fw_state=CarriedState())


def test_carry_state_trains_favor_with_fixed_features():
    model, d = build_lm("transformer_lm_fw_tiny", SMALL + fw("favor", "sum") + [
        "--no-token-positional-embeddings", "--fw-favor-redraw", "never"])
    tokens = random_tokens(d, 1, 8, torch.Generator().manual_seed(4))
    state = CarriedState()
    model.train()(tokens[:, :4], fw_state=state)
    logits, _ = model(tokens[:, 4:], fw_state=state)
    assert torch.isfinite(logits).all()


def test_language_model_refuses_a_state_dict_of_other_settings():
    trained, _ = build_lm("transformer_lm_fw_tiny", ["--fw-update-rule", "sum"])
    model, _ = build_lm("transformer_lm_fw_tiny")  # the architecture's delta rule
    with pytest.raises(SystemExit, match=r"error: the checkpoint was trained with "
                                         r"--fw-update-rule sum, not delta \(its weights"):
        model.load_state_dict(trained.state_dict())
