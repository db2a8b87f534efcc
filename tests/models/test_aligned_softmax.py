"""A softmax cross-attention with --fw-cross-align P: its weights are softmax's times the aligned window w(i, j),
renormalised; generation's steps add the teacher-forced forward's prior (float64, exactly) and decode as it trains;
a plain softmax model and args saved before the prior stay plain (the prior's ratio: tests/e2e/test_align_ratio.py)."""
import pytest
import torch
from fairseq.modules import MultiheadAttention

from factories import build_model, decode_step_by_step, parse_model_args, random_tokens
from factories import _build as build_from_args
from fw_fairseq.modules.aligned_softmax import AlignedMultiheadAttention, aligned_log_window
from fw_fairseq.modules.cross_align import aligned_angles

SOFTMAX_PRIOR = ["--fw-attention", "none", "--fw-cross-align", "3", "--fw-align-ratio", "1.5"]
# fairseq's softmax runs in float32 whatever the model's dtype (fairseq.utils.softmax)
FAIRSEQ_SOFTMAX = dict(rtol=1e-5, atol=1e-6)


def padded_source(batch_lengths, dim, generator):
    """Left-padded sources [S, B, C] (fairseq's layout) and their padding mask [B, S]."""
    longest = max(batch_lengths)
    mask = torch.tensor([[j < longest - n for j in range(longest)] for n in batch_lengths])
    return torch.randn(longest, len(batch_lengths), dim, generator=generator, dtype=torch.float64), mask


@pytest.mark.parametrize("free", [0, 1])
def test_weights_are_softmax_times_the_window(free):
    """Every head's weights are softmax's times the window, renormalised; a head free of the prior
    (--fw-align-free-heads) keeps softmax's."""
    g = torch.Generator().manual_seed(0)
    aligned = AlignedMultiheadAttention(8, 2, 3, 1.5, free).double()
    plain = MultiheadAttention(8, 2, encoder_decoder_attention=True).double()
    plain.load_state_dict(aligned.state_dict())
    source, mask = padded_source([6, 4, 5], 8, g)
    query = torch.randn(7, 3, 8, generator=g, dtype=torch.float64)
    weights = [attn(query, source, source, key_padding_mask=mask, static_kv=True, need_weights=True,
                    need_head_weights=True)[1].double() for attn in (aligned, plain)]  # [H, B, T, S]
    positions = torch.arange(7, dtype=torch.float64).expand(3, -1)
    window = aligned_log_window(3, aligned_angles(mask, 3, 6, positions, 1.5)).exp()  # [B, T, S]
    window = torch.stack([window, torch.ones_like(window) if free else window])  # [H, B, T, S]
    expected = weights[1] * window
    torch.testing.assert_close(weights[0], expected / expected.sum(-1, keepdim=True), **FAIRSEQ_SOFTMAX)


def test_steps_add_the_teacher_forced_prior_and_decode_as_it_trains():
    model, d = build_model(SOFTMAX_PRIOR)
    attention = model.decoder.layers[0].encoder_attn
    assert isinstance(attention, AlignedMultiheadAttention)
    biases = []
    hook = attention.apply_sparse_mask

    def recording(weights, *shape):
        biases.append(attention._bias.clone())
        return hook(weights, *shape)

    attention.apply_sparse_mask = recording
    g = torch.Generator().manual_seed(3)
    src, prev = random_tokens(d, 3, 6, g), random_tokens(d, 3, 9, g)
    src[1, :2] = d.pad()  # a left-padded, shorter source
    src_lengths = (src != d.pad()).sum(1)
    full, _ = model(src, src_lengths, prev)
    steps = decode_step_by_step(model, prev, model.encoder(src, src_lengths=src_lengths))
    torch.testing.assert_close(torch.cat(biases[1:], dim=2), biases[0], rtol=0, atol=0)  # [B, 1, T, S]
    torch.testing.assert_close(steps, full, **FAIRSEQ_SOFTMAX)


def test_plain_softmax_and_older_args_stay_plain():
    """The translation preset gives softmax cross-attention no prior; args saved before softmax took it (no
    --fw-align-ratio) hold the preset's 4 of that time, which such a model never read."""
    model, _ = build_model(["--fw-attention", "none"])
    assert type(model.decoder.layers[0].encoder_attn) is MultiheadAttention
    args = parse_model_args(["--fw-attention", "none", "--fw-cross-align", "4"])
    del args.fw_align_ratio
    model, _ = build_from_args(args, torch.float64)
    assert type(model.decoder.layers[0].encoder_attn) is MultiheadAttention and args.fw_cross_align == 0
