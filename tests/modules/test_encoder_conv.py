"""--fw-encoder-conv (float64): encoder self-attention returns its read plus a depthwise convolution of width K
over its values, padded positions read as 0; no other block has one, and width 0 is the block without it."""
import pytest
import torch

from factories import block_pair, build_model
from fw_fairseq.modules import FastWeightConfig

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


def test_only_the_encoder_blocks_have_it():
    model, _ = build_model(["--fw-encoder-conv", "5"])
    assert all(layer.self_attn.encoder_conv.conv.weight.shape == (32, 1, 5) for layer in model.encoder.layers)
    assert all(layer.self_attn.encoder_conv is None and layer.encoder_attn.encoder_conv is None
               for layer in model.decoder.layers)
    plain, _ = build_model(["--fw-encoder-conv", "0"])
    assert not [n for n, _ in plain.named_parameters() if "encoder_conv" in n]


@pytest.mark.parametrize("width", [3, 5])
def test_the_convolution_is_torchs_depthwise_conv1d_and_its_gradients_check(width):
    from fw_fairseq.modules.encoder_conv import DepthwiseConv
    g = torch.Generator().manual_seed(2)
    v = torch.randn(6, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)  # [S, B, C]
    w = torch.randn(4, width, generator=g, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, generator=g, dtype=torch.float64, requires_grad=True)
    expected = torch.nn.functional.conv1d(v.permute(1, 2, 0), w[:, None], b, padding=width // 2, groups=4)
    torch.testing.assert_close(DepthwiseConv.apply(v, w, b), expected.permute(2, 0, 1), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(DepthwiseConv.apply, (v, w, b))
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(DepthwiseConv.apply(v, w, b).sum(), v, create_graph=True)
