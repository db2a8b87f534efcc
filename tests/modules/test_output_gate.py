"""--fw-output-gate (float64): a block's read y goes to the output projection as sigmoid(W_g x_t + b_g) * y,
the gate computed from the query's input x_t per channel (`channel`) or per head (`head`), or as each head's
y / rms(y) times a learned weight per channel (`rms`), on every path and in every decoding cache; without the
flag the block has no gate parameters."""
import pytest
import torch

from factories import block_pair, build_model, decode_step_by_step, random_tokens
from fw_fairseq.modules import FastWeightConfig

C, H = 12, 2  # d_key 6
PATHS = {"encoder": dict(causal=False), "causal": dict(causal=True),
         "cross": dict(causal=False, kdim=10, vdim=10, encoder_decoder_attention=True)}


def pair(path, rule, kind):
    """The same block with the output gate `kind` and without, the output projections the identity, so that
    each returns its read: (gated, plain)."""
    configs = [FastWeightConfig("dpfp", rule, 2, 8, frozenset(), delta_norm="l2", output_gate=gate)
               for gate in (kind, "none")]
    gated, plain = block_pair(C, H, *configs, "output_gate.", **PATHS[path])
    with torch.no_grad():  # far from their init, so that the gates (or the norm's weights) differ
        for param in gated.output_gate.parameters():
            param.normal_()
    return gated, plain


def expected_rms(gated, read):
    """Each head's read [T, B, C] over its root mean square, times the norm's weight per channel."""
    heads = read.reshape(*read.shape[:2], H, C // H)  # [T, B, H, D]
    rms = (heads.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    return (heads / rms).reshape(read.shape) * gated.output_gate.weight


def expected_gate(gated, query):
    """sigmoid(W_g x + b_g) [T, B, C]: each channel's own, or its head's (channels h*D .. h*D + D - 1)."""
    gate = torch.sigmoid(query @ gated.output_gate.proj.weight.T + gated.output_gate.proj.bias)
    if gated.output_gate.kind == "head":
        gate = torch.stack([gate[..., c // (C // H)] for c in range(C)], dim=-1)  # [T, B, H] -> [T, B, C]
    return gate


@pytest.mark.parametrize("kind", ["channel", "head", "rms"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_the_gate_multiplies_the_read(path, rule, kind):
    gated, plain = pair(path, rule, kind)
    g = torch.Generator().manual_seed(1)
    query = torch.randn(5, 3, C, generator=g, dtype=torch.float64)  # [T, B, C]
    key = torch.randn(7, 3, 10, generator=g, dtype=torch.float64) if path == "cross" else query
    read = plain(query, key, key)[0]
    if kind == "rms":
        expected = expected_rms(gated, read)
        assert not torch.allclose(expected, read)
    else:
        gate = expected_gate(gated, query)
        assert gate.std() > 0.1  # the gates differ
        expected = read * gate
    torch.testing.assert_close(gated(query, key, key)[0], expected, rtol=1e-12, atol=1e-12)
    if path == "encoder":
        return
    state = {}  # the decoding caches (causal: lazy cache; cross: the source memory) go through the gate too
    steps = []
    for t in range(5):
        written = key if path == "cross" else query[t: t + 1]  # a causal step writes its own position
        steps.append(gated(query[t: t + 1], written, written, incremental_state=state,
                           static_kv=path == "cross")[0])
    torch.testing.assert_close(torch.cat(steps), expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind,shapes", [("channel", {"proj.weight": (C, C), "proj.bias": (C,)}),
                                         ("head", {"proj.weight": (H, C), "proj.bias": (H,)}),
                                         ("rms", {"weight": (C,)})])
def test_only_a_gated_block_has_gate_parameters(kind, shapes):
    gated, plain = pair("encoder", "sum", kind)
    extra = {n: p.shape for n, p in gated.named_parameters()}.items() - {
        n: p.shape for n, p in plain.named_parameters()}.items()
    assert dict(extra) == {f"output_gate.{name}": shape for name, shape in shapes.items()}


def test_the_norm_keeps_a_read_of_zero_finite_and_fp16_reads_in_fp16():
    gated, _ = pair("causal", "delta", "rms")
    norm = gated.output_gate.float()
    assert torch.equal(norm(None, torch.zeros(2, 1, C)), torch.zeros(2, 1, C))
    read = torch.randn(3, 2, C).half() * 300  # squares past fp16's range: the mean square is taken in fp32
    out = norm(None, read)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()


def test_gated_model_decodes_as_teacher_forcing():
    model, d = build_model(["--fw-feature-map", "dpfp", "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                            "--fw-output-gate", "head"])
    assert all(layer.encoder_attn.output_gate.kind == "head" for layer in model.decoder.layers)
    g = torch.Generator().manual_seed(3)
    src, prev = random_tokens(d, 3, 8, g), random_tokens(d, 3, 6, g)
    full, _ = model(src, torch.full((3,), 8), prev)
    encoder_out = model.encoder(src, src_lengths=torch.full((3,), 8))
    torch.testing.assert_close(decode_step_by_step(model, prev, encoder_out), full, rtol=1e-9, atol=1e-9)


def test_a_list_gates_those_blocks_only_and_the_record_names_them():
    from fw_fairseq.models.checkpoints import RECORD, decode

    model, _ = build_model(["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum",
                            "--fw-output-gate", "channel:cross"])
    layer = model.decoder.layers[0]
    assert layer.encoder_attn.output_gate.kind == "channel"
    assert layer.self_attn.output_gate is None and model.encoder.layers[0].self_attn.output_gate is None
    assert decode(model.state_dict()[RECORD])["--fw-output-gate"] == "channel:cross"
    # a LIST naming every fast-weight block is the gate everywhere; one naming only softmax blocks, none
    for flags, record in ((["--fw-attention", "cross,decoder", "--fw-output-gate", "head:decoder,cross"], "head"),
                          (["--fw-attention", "decoder", "--fw-output-gate", "channel:encoder,cross"], "none")):
        model, _ = build_model(["--fw-feature-map", "elu", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum",
                                *flags])
        assert decode(model.state_dict()[RECORD])["--fw-output-gate"] == record
