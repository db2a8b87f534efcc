"""An empty batch (B = 0, or H = 0) is a valid input to every public op: empty outputs and zero-size
states of the right shapes, forward and backward (the chunked forms used to fail reshaping 0 elements)."""
import pytest
import torch

from public_ops import OP_IDS, PUBLIC_OPS


@pytest.mark.parametrize("empty", ["B", "H"])
@pytest.mark.parametrize("name,T,call", PUBLIC_OPS, ids=OP_IDS)
def test_empty_batch_gives_empty_results_and_gradients(make_inputs, name, T, call, empty):
    shape = dict(B=0, H=2) if empty == "B" else dict(B=2, H=0)
    inputs = make_inputs(**shape, T=T, E=6, M=5, requires_grad=True)
    expected = [r.shape for r in call(*make_inputs(B=2, H=2, T=T, E=6, M=5))]
    results = call(*inputs)
    dim = 0 if empty == "B" else 1
    assert [r.shape[:dim] + (2,) + r.shape[dim + 1:] for r in results] == expected
    assert all(r.numel() == 0 for r in results)
    grads = torch.autograd.grad(results, inputs, [torch.zeros_like(r) for r in results], allow_unused=True)
    assert any(g is not None for g in grads)
    for x, g in zip(inputs, grads):
        assert g is None or g.shape == x.shape
