"""--fw-encoder-conv and --fw-decoder-conv (float64): encoder self-attention returns its read plus a depthwise
convolution of width K over its values, padded positions read as 0; decoder self-attention the same over the position
and the K - 1 before it, in training and step by step through beam search; no other block has one, and width 0 is the
block without it."""
import pytest
import torch

from factories import block_pair, build_model, check_decodes_as_it_trains
from fw_fairseq.modules import FastWeightConfig
from fw_fairseq.modules.value_conv import DepthwiseConv

C, H = 12, 2  # d_key 6


def pair(width):
    """The encoder block with --fw-encoder-conv width and without, sharing every other weight, the output
    projections the identity: (convolved, plain)."""
    configs = [FastWeightConfig("dpfp", "sum", 2, 8, frozenset(), encoder_conv=conv) for conv in (width, 0)]
    return block_pair(C, H, *configs, "encoder_conv.", causal=False)


@pytest.mark.parametrize("width", [3, 5])
def test_the_convolution_of_the_values_adds_to_the_read(width):
    convolved, plain = pair(width)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, C, generator=g, dtype=torch.float64)  # [S, B, C]
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, :2] = True  # fairseq pads sources on the left
    v = (x @ convolved.v_proj.weight.T + convolved.v_proj.bias).masked_fill(pad.t()[..., None], 0.0)
    w, b = convolved.encoder_conv.conv.weight[:, 0], convolved.encoder_conv.conv.bias  # [C, K], [C]
    expected = plain(x, x, x, key_padding_mask=pad)[0] + b
    for s in range(7):  # o_s += sum_j w_j v_{s+j}, j = -K/2 .. K/2, outside the sentence 0
        for j in range(-(width // 2), width // 2 + 1):
            if 0 <= s + j < 7:
                expected[s] += w[:, j + width // 2] * v[s + j]
    torch.testing.assert_close(convolved(x, x, x, key_padding_mask=pad)[0], expected, rtol=1e-12, atol=1e-12)


def test_only_their_own_blocks_have_them():
    model, _ = build_model(["--fw-encoder-conv", "5", "--fw-decoder-conv", "2"])
    assert all(layer.self_attn.encoder_conv.conv.weight.shape == (32, 1, 5) and layer.self_attn.decoder_conv is None
               for layer in model.encoder.layers)
    assert all(layer.self_attn.encoder_conv is None and layer.encoder_attn.encoder_conv is None
               for layer in model.decoder.layers)
    assert all(layer.self_attn.decoder_conv.conv.weight.shape == (32, 1, 2) and layer.encoder_attn.decoder_conv is None
               for layer in model.decoder.layers)
    plain, _ = build_model(["--fw-encoder-conv", "0"])
    assert not [n for n, _ in plain.named_parameters() if "_conv" in n]  # --fw-decoder-conv: 0 by default


@pytest.mark.parametrize("width", [3, 5])
def test_the_convolution_is_torchs_depthwise_conv1d_and_its_gradients_check(width):
    g = torch.Generator().manual_seed(2)
    v = torch.randn(6, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)  # [S, B, C]
    w = torch.randn(4, width, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    for left in (width // 2, width - 1):  # centred (the encoder's), causal (the decoder's)
        # [B, C, S] padded by `left` before and K - 1 - left after
        padded = torch.nn.functional.pad(v.permute(1, 2, 0), (left, width - 1 - left))
        expected = torch.nn.functional.conv1d(padded, w[:, None], b, groups=4)
        torch.testing.assert_close(DepthwiseConv.apply(v, w, b, left), expected.permute(2, 0, 1), rtol=1e-12,
                                   atol=1e-12)
        assert torch.autograd.gradcheck(lambda *x: DepthwiseConv.apply(*x, left), (v, w, b))
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(DepthwiseConv.apply(v, w, b, 1).sum(), v, create_graph=True)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_the_decoder_convolution_adds_the_values_before_each_position(width):
    configs = [FastWeightConfig("dpfp", "delta", 2, 8, frozenset(), decoder_conv=conv) for conv in (width, 0)]
    convolved, plain = block_pair(C, H, *configs, "decoder_conv.", causal=True)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 3, C, generator=g, dtype=torch.float64)  # [T, B, C]
    v = x @ convolved.v_proj.weight.T + convolved.v_proj.bias
    w, b = convolved.decoder_conv.conv.weight[:, 0], convolved.decoder_conv.conv.bias  # [C, K], [C]
    expected = plain(x, x, x)[0] + b
    for t in range(7):  # o_t += sum_j w_j v_{t-j}, j = 0 .. K-1, before the sentence 0
        for j in range(width):
            if t - j >= 0:
                expected[t] += w[:, width - 1 - j] * v[t - j]
    torch.testing.assert_close(convolved(x, x, x)[0], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_the_decoder_convolution_decodes_as_it_trains_through_beam_reorders(rule):
    """fairseq's beam layout and reorders: every step equals the forward over the whole prefix."""
    model, d = build_model(["--fw-decoder-conv", "3", "--fw-decoder-rule", rule])
    check_decodes_as_it_trains(model, d)
