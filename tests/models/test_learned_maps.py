"""The learned feature maps (fw_fairseq/ops/maps/learned.py: T2R, trainable Hedgehog) through the sum and delta
rules, in float64 with their parameters drawn far from their initialisation: the chunked forms equal the reference
loops (outputs and the maps' gradients), incremental decoding equals teacher forcing past the lazy cache's switch,
every kernel declines them (no row form) so reads and decoding steps run the PyTorch forms; their parameters live in
the attention's state dict, T2R's per head; trainable Hedgehog starts as the fixed map; the flags are checked."""
import pytest
import torch

from factories import build_model, decode_step_by_step, parse_model_args, random_tokens, randomize_scalar_projections
from fw_fairseq.decoding.backend import TORCH, backend
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.ops import RULES, feature_map
from fw_fairseq.ops.maps.learned import T2r, TrainableHedgehog
from fw_fairseq.ops.rules.raw_read import short_read

MAPS = {"t2r": ["--fw-feature-map", "t2r", "--fw-t2r-features", "12"],
        "hedgehog-trainable": ["--fw-feature-map", "hedgehog", "--fw-hedgehog-trainable"]}
CASES = [(name, rule) for name in MAPS for rule in ("sum", "delta")]


def _phi(name, heads=3, d_key=6, seed=0):
    phi = feature_map("t2r", d_key, heads=heads, t2r_features=10) if name == "t2r" else feature_map(
        "hedgehog", d_key, heads=heads, trainable=True)
    return _randomize(phi.double(), torch.Generator().manual_seed(seed))


def _randomize(phi, g):
    """The map's parameters drawn far from their initialisation (Hedgehog's identity would hide its layer)."""
    with torch.no_grad():
        for p in phi.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype))
    return phi


@pytest.mark.parametrize("name,rule", CASES)
def test_chunked_equals_the_loop_with_the_maps_gradients(name, rule):
    phi = _phi(name)
    g = torch.Generator().manual_seed(1)
    q, k = (torch.randn(2, 3, 70, 6, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 70, 5, generator=g, dtype=torch.float64)
    scalars = () if rule == "sum" else (torch.rand(2, 3, 70, generator=g, dtype=torch.float64),)
    record = RULES[rule]
    outputs = []
    for form in (record.causal, record.naive):
        fq, fk = phi(q, True), phi(k, False)  # [2, 3, 70, E]
        if record.normalised_phi:
            fq, fk = (x / x.sum(-1, keepdim=True).clamp_min(1e-6) for x in (fq, fk))
        o = form(fq, fk, v, *scalars)[0]  # [2, 3, 70, 5]
        outputs.append((o, torch.autograd.grad(o.square().sum(), list(phi.parameters()))))
    (ours, our_grads), (ref, ref_grads) = outputs
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    for a, b in zip(our_grads, ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def _model(name, rule):
    model, d = build_model(MAPS[name] + ["--fw-update-rule", rule, "--fw-decoder-rule", rule,
                                          "--no-token-positional-embeddings"])
    g = torch.Generator().manual_seed(2)
    for module in model.modules():
        if hasattr(module, "phi") and hasattr(module, "rule"):
            _randomize(module.phi, g)
            randomize_scalar_projections(module, g)
    return model, d


@pytest.mark.parametrize("name,rule", CASES)
def test_decoding_equals_teacher_forcing_past_the_switch(name, rule):
    model, d = _model(name, rule)
    attention = model.decoder.layers[0].self_attn
    M = attention.head_dim + attention.rule.z_column
    steps = attention.phi.out_dim * M // (attention.block.keys.width + M) + 4  # past the fold into the state
    g = torch.Generator().manual_seed(3)
    src, prev = random_tokens(d, 2, 6, g), random_tokens(d, 2, steps, g)
    with torch.no_grad():
        expected = model(src, torch.tensor([6, 6]), prev)[0]  # [B, T, V]
        encoder_out = model.encoder(src, src_lengths=torch.tensor([6, 6]))
        stepwise = decode_step_by_step(model, prev, encoder_out)
    torch.testing.assert_close(stepwise, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name,rule", CASES)
def test_every_kernel_declines_them(name, rule):
    model, _ = _model(name, rule)
    for attention in (model.encoder.layers[0].self_attn, model.decoder.layers[0].self_attn):
        q = torch.randn(1, attention.num_heads, 3, attention.head_dim, dtype=torch.float32)
        assert attention.phi.kernel_map is None
        assert short_read(attention.phi, attention.rule, q, q, q, (), None, True, attention.block.norm) is None
        assert backend(attention.block, q) is TORCH


def test_parameters_live_in_the_attention_per_head():
    model, _ = build_model(MAPS["t2r"])
    attention = model.encoder.layers[0].self_attn
    assert isinstance(attention.phi, T2r) and attention.phi.out_dim == 12
    shapes = {k: tuple(v.shape) for k, v in attention.state_dict().items() if k.startswith("t2r.")}
    assert shapes == {"t2r.linear.weight": (2, 12, 16), "t2r.linear.bias": (2, 12)}  # [H, K, d], [H, K]


def test_trainable_hedgehog_starts_as_the_fixed_map():
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    trainable = feature_map("hedgehog", 4, heads=3, trainable=True).double()
    assert isinstance(trainable, TrainableHedgehog)
    torch.testing.assert_close(trainable(x, True), feature_map("hedgehog", 4)(x, True), rtol=0, atol=0)


@pytest.mark.parametrize("call,match", [
    (lambda: feature_map("t2r", 4, heads=2, t2r_features=0), "T2r: features=0 is not allowed"),
    (lambda: feature_map("t2r", 4, heads=2, t2r_features=3)(torch.randn(3, 5, 4), True),
     r"T2r: input of shape \(3, 5, 4\) has no head dim of 2 at dim -3"),
])
def test_bad_arguments_stop_in_one_line(call, match):
    with pytest.raises(ValueError, match=match):
        call()


@pytest.mark.parametrize("argv,message", [
    (["--fw-t2r-features", "0"], "--fw-t2r-features got '0'; allowed: an integer >= 1"),
    (["--fw-hedgehog-trainable", "2"], "--fw-hedgehog-trainable got '2'; allowed: 0 or 1"),
])
def test_the_flags_refuse_bad_values(argv, message, capsys):
    with pytest.raises(SystemExit):
        parse_model_args(argv)
    assert message in capsys.readouterr().err


def test_the_record_keeps_the_maps_flags():
    settings = FastWeightConfig.from_args(parse_model_args(MAPS["t2r"])).settings()
    assert settings["--fw-t2r-features"] == "12" and "--fw-hedgehog-trainable" not in settings
    settings = FastWeightConfig.from_args(parse_model_args(MAPS["hedgehog-trainable"])).settings()
    assert settings["--fw-hedgehog-trainable"] == "1" and "--fw-t2r-features" not in settings
