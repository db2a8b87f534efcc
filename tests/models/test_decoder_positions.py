"""--fw-decoder-positions (float64): `none` takes fairseq's positional embedding out of the decoder only, so that a
decoder position's output is what the same decoder computes on input embeddings without positions; the encoder
keeps its own; generation equals teacher forcing through beam search's reorders; the checkpoint record keeps the
value and a load with the other one is refused in one line; a softmax decoder cannot take `none`."""
import pytest
import torch

from factories import build_lm, build_model, check_decodes_as_it_trains, random_tokens
from fw_fairseq.models.checkpoints import RECORD, decode


def test_none_drops_the_decoders_positions_and_keeps_the_encoders():
    plain, _ = build_model(["--fw-decoder-rule", "delta"])
    without, _ = build_model(["--fw-decoder-rule", "delta", "--fw-decoder-positions", "none"])
    assert plain.decoder.embed_positions is not None and without.decoder.embed_positions is None
    assert without.encoder.embed_positions is not None
    assert decode(plain.state_dict()[RECORD])["--fw-decoder-positions"] == "absolute"
    assert decode(without.state_dict()[RECORD])["--fw-decoder-positions"] == "none"


def test_without_positions_the_decoder_reads_its_token_embeddings_alone():
    """The same weights with positions and without: the decoder without them equals the one with them whose
    positional embedding is made to add zeros."""
    plain, d = build_model(["--fw-decoder-rule", "delta"], seed=3)
    without, _ = build_model(["--fw-decoder-rule", "delta", "--fw-decoder-positions", "none"], seed=3)
    weights = {k: v for k, v in plain.state_dict().items() if k != RECORD and not k.startswith("decoder.embed_pos")}
    without.load_state_dict(weights | {RECORD: without.state_dict()[RECORD]})  # the sinusoids are no weights
    g = torch.Generator().manual_seed(4)
    src, prev = random_tokens(d, 3, 5, g), random_tokens(d, 3, 7, g)
    src_lengths = torch.full((3,), 5)
    expected = without(src, src_lengths, prev)[0]
    assert not torch.allclose(plain(src, src_lengths, prev)[0], expected)
    plain.decoder.embed_positions.forward = lambda tokens, incremental_state=None: torch.zeros(
        (*tokens.shape[:1], 1 if incremental_state is not None else tokens.shape[1], plain.decoder.embed_dim),
        dtype=torch.float64)
    torch.testing.assert_close(plain(src, src_lengths, prev)[0], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_it_decodes_as_it_trains_through_beam_reorders(rule):
    model, d = build_model(["--fw-decoder-rule", rule, "--fw-decoder-positions", "none", "--fw-decoder-conv", "3"])
    check_decodes_as_it_trains(model, d)


def test_a_checkpoint_refuses_the_other_value():
    plain, _ = build_model(["--fw-decoder-rule", "delta"])
    without, _ = build_model(["--fw-decoder-rule", "delta", "--fw-decoder-positions", "none"])
    with pytest.raises(SystemExit, match="--fw-decoder-positions absolute, not none"):
        without.load_state_dict(plain.state_dict())


def test_a_softmax_decoder_cannot_drop_them():
    with pytest.raises(SystemExit, match="--fw-decoder-positions: none needs fast-weight decoder self-attention"):
        build_model(["--fw-attention", "encoder,cross", "--fw-decoder-positions", "none"])


def test_a_language_models_decoder_takes_it_as_no_token_positional_embeddings():
    lm, d = build_lm("transformer_lm_fw_tiny", ["--fw-decoder-positions", "none"])
    stock, _ = build_lm("transformer_lm_fw_tiny", ["--no-token-positional-embeddings"])
    assert lm.decoder.embed_positions is None and stock.decoder.embed_positions is None
    lm.load_state_dict({k: v for k, v in stock.state_dict().items() if k != RECORD} |
                       {RECORD: lm.state_dict()[RECORD]})
    tokens = random_tokens(d, 2, 9, torch.Generator().manual_seed(6))
    torch.testing.assert_close(lm(tokens)[0], stock(tokens)[0], rtol=1e-12, atol=1e-12)
