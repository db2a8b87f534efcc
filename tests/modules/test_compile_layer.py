"""torch.compile(fullgraph=True) of a FastWeightAttention layer in training mode, forward and backward:
no graph break (fullgraph raises on one) and, in float64, the output and every gradient (parameters
and inputs) equal to eager, on each path, for every rule and feature map. The causal sequences span
several chunks, so the chunked Functions' custom ops run with per-chunk states."""
import pytest
import torch

from fw_fairseq.modules import FastWeightAttention, FastWeightConfig

C, H = 12, 2  # d_key 6
PATHS = {"encoder": dict(causal=False), "causal": dict(causal=True),
         "cross": dict(causal=False, kdim=10, vdim=10, encoder_decoder_attention=True)}
# (path, rule, feature map, output gate): every rule on the causal path (the chunked Functions' custom ops,
# several chunks), every path, every feature map (FAVOR+ redraws its random features in every training
# forward), both output gates, the encoder's convolution (on the encoder path, as in translation); about 4 s of compiling each on 2 CPU cores
CASES = [("causal", "sum", "dpfp", "none"), ("causal", "delta", "dpfp", "none"),
         ("causal", "gated_delta", "dpfp", "none"), ("causal", "sum", "elu", "none"),
         ("causal", "delta", "favor", "none"), ("encoder", "sum", "dpfp", "none"),
         ("encoder", "gated_delta", "elu", "none"), ("cross", "delta", "dpfp", "none"),
         ("cross", "gated_delta", "favor", "none"), ("causal", "sum", "hedgehog", "channel"),
         ("cross", "sum", "dpfp", "head")]


def backend(feature_map):
    """aot_eager; for ELU+1, inductor's decompositions and partitioner run eagerly (what inductor
    compiles, without its compile time): plain aot_eager fails on it in torch 2.13, where the fake
    strides of elu_backward on the permuted heads differ from the CPU kernel's (a torch bug, outside
    these ops). FAVOR+ stays on aot_eager: decomposed, its float32 random features round differently."""
    return "aot_eager_decomp_partition" if feature_map == "elu" else "aot_eager"


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def training_layer(path, rule, feature_map, output_gate):
    torch.manual_seed(0)
    config = FastWeightConfig(feature_map=feature_map, update_rule=rule, dpfp_nu=2, favor_features=8,
                              places=frozenset(), output_gate=output_gate, encoder_conv=3)
    return FastWeightAttention(C, H, config, **PATHS[path]).double().train()


def layer_inputs(path, T=70, S=9, B=2):
    """query [T, B, C], key [S, B, kdim] (the query itself off the cross path), key padding [B, S]."""
    g = torch.Generator().manual_seed(1)
    query = torch.randn(T, B, C, generator=g, dtype=torch.float64, requires_grad=True)
    if path != "cross":
        return query, query, None
    key = torch.randn(S, B, 10, generator=g, dtype=torch.float64, requires_grad=True)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, :3] = True  # fairseq pads sources on the left
    return query, key, pad


def output_and_grads(layer, forward, query, key, pad):
    """The layer's output and the gradients of its parameters and inputs, under a fixed upstream
    gradient; the seed fixes FAVOR+'s redraw, so that eager and compiled draw the same features."""
    torch.manual_seed(2)
    out = forward(query, key, pad)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    wrt = [*layer.parameters(), *{id(x): x for x in (query, key)}.values()]
    return [out.detach(), *torch.autograd.grad(out, wrt, upstream)]


@pytest.mark.parametrize("path,rule,feature_map,output_gate", CASES, ids=["-".join(case) for case in CASES])
def test_compiled_layer_trains_like_eager(path, rule, feature_map, output_gate):
    layer = training_layer(path, rule, feature_map, output_gate)
    query, key, pad = layer_inputs(path)

    def forward(query, key, pad):
        return layer(query, key, key, key_padding_mask=pad)[0]

    compiled = torch.compile(forward, backend=backend(feature_map), fullgraph=True)
    torch.testing.assert_close(output_and_grads(layer, compiled, query, key, pad),
                               output_and_grads(layer, forward, query, key, pad), rtol=1e-12, atol=1e-12)
