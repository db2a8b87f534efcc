"""A whole transformer_fw through the fused read (fw_fairseq/ops/fused_read/) against its other path (phi formed in
memory, or the CPU kernels), in float64 (float32 on a GPU): the training forward with a left-padded source (encoder
self-, decoder self- and cross-attention, each block through the fused read), its loss and every parameter's
gradient. Without a GPU the fused read runs under Triton's interpreter on the CPU (tests/conftest.py)."""
import pytest
import torch

pytest.importorskip("triton")

from factories import build_model, random_tokens  # noqa: E402
from fw_fairseq.modules import cross_align  # noqa: E402
from fw_fairseq.ops.fused_read import dispatch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# compiled for CUDA the fused read takes float32 (launch.CUDA_DTYPES), and the other path runs the column kernels in
# float32 too: the two sum in different orders
DTYPE, TOL = (torch.float64, 1e-9) if DEVICE == "cpu" else (torch.float32, 1e-4)
# 1+1 layers: the interpreter runs a kernel at about a millisecond an op; every map and rule has its own op tests
ONE_LAYER = ["--encoder-layers", "1", "--decoder-layers", "1"]
CONFIGS = {
    "dpfp2_sum": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2"],
    "dpfp2_delta_decoder": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-decoder-rule", "delta"],
    "dpfp2_sum_align4": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-cross-align", "4"],
}


def batch(d, g):
    lengths = [7, 3]
    src = torch.full((2, max(lengths)), d.pad())
    for i, n in enumerate(lengths):
        src[i, max(lengths) - n:] = random_tokens(d, 1, n, g)[0]  # fairseq pads sources on the left
    return src.to(DEVICE), torch.tensor(lengths, device=DEVICE), random_tokens(d, 2, 6, g).to(DEVICE)


def loss_and_grads(model, src, lengths, prev):
    model.zero_grad()
    logits, _ = model(src, lengths, prev)
    loss = (logits.log_softmax(-1) * torch.linspace(-1, 1, logits.shape[-1], dtype=logits.dtype,
                                                       device=logits.device)).sum()
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_model_through_the_fused_read_equals_its_other_path(config, monkeypatch):
    model, d = build_model(CONFIGS[config] + ONE_LAYER)
    model.to(DEVICE, DTYPE).train()  # training: the blocks record autograd, so the fused Function's backward runs
    for module in model.modules():
        if hasattr(module, "dropout_module"):
            module.dropout_module.p = 0.0
    src, lengths, prev = batch(d, torch.Generator().manual_seed(0))
    monkeypatch.setattr(dispatch, "DEVICES", ())  # the other path: phi formed in memory, or the CPU kernels
    torch.manual_seed(1)
    expected, expected_grads = loss_and_grads(model, src, lengths, prev)
    calls = []
    original, aligned = dispatch.read, cross_align.fused_aligned_read_for
    monkeypatch.setattr(dispatch, "read", lambda *args: calls.append(args[1].name) or original(*args))

    def aligned_taken(*args):  # the aligned cross-attention's own entry, counted where it takes the block
        o = aligned(*args)
        calls.extend([args[1].name] if o is not None else [])
        return o

    monkeypatch.setattr(cross_align, "fused_aligned_read_for", aligned_taken)
    monkeypatch.setattr(dispatch, "DEVICES", ("cuda", "cpu"))
    torch.manual_seed(1)  # FAVOR+ redraws R at every training forward: the same draw for both paths
    got, grads = loss_and_grads(model, src, lengths, prev)
    assert len(calls) == 3  # the encoder self-, decoder self- and cross-attention blocks
    torch.testing.assert_close(got, expected, rtol=TOL, atol=TOL)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=TOL * 10, atol=TOL, msg=lambda m: f"{name}: {m}")


def test_the_module_takes_the_fused_read_only_where_the_dispatch_does():
    q = torch.zeros(2, 3, 8)
    assert not dispatch.takes(q)  # the CPU is not among the devices outside the tests
