"""The public ops are safe under autocast on their own (not only inside FastWeightAttention, which
turns autocast off itself): inside torch.autocast they return, and differentiate to, exactly what
they return without it for the same input dtypes, with the state in the documented dtype. CPU
bf16 autocast stands in for CUDA's: without this, its matmuls ran in bf16 against the float32
state (a crash: "Input dtypes must be the same") or gave a bf16 state."""
import pytest
import torch

from public_ops import OP_IDS, PUBLIC_OPS


def _results_and_grads(call, inputs, backward_autocast):
    """The op's results and the gradients of its inputs under fixed random upstream gradients."""
    results = call(*inputs)
    g = torch.Generator().manual_seed(7)
    upstream = [torch.randn(r.shape, generator=g, dtype=torch.float64).to(r.dtype) for r in results]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=backward_autocast):
        grads = torch.autograd.grad(results, inputs, upstream, allow_unused=True)
    return [r.detach() for r in results], grads


def _assert_same(got, expected):
    for a, b in zip(got, expected, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name,T,call", PUBLIC_OPS, ids=OP_IDS)
def test_autocast_changes_nothing(make_inputs, name, T, call, dtype):
    # the backward outside the autocast block, as torch recommends for every op
    inputs = make_inputs(B=2, H=2, T=T, E=6, M=5, dtype=dtype, requires_grad=True)
    plain, plain_grads = _results_and_grads(call, inputs, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        auto, auto_grads = _results_and_grads(call, inputs, False)
    _assert_same(auto + list(auto_grads), plain + list(plain_grads))
    if name.startswith(("sum", "delta", "gated", "write")):
        assert auto[-1].dtype == torch.float32  # the state: float32 for bf16 and float32 inputs


@pytest.mark.parametrize("name,T,call", [case for case in PUBLIC_OPS if "chunk" in case[0]],
                         ids=[name for name in OP_IDS if "chunk" in name])
def test_hand_written_backward_ignores_autocast(make_inputs, name, T, call):
    # a loss.backward() inside the autocast block reaches the chunked Functions' own backward with
    # autocast on; it must compute what it computes without (torch's own ops' backward follows the
    # caller's autocast there, which is why torch recommends a backward outside the block)
    inputs = make_inputs(B=2, H=2, T=T, E=6, M=5, dtype=torch.float32, requires_grad=True)
    plain = _results_and_grads(call, inputs, False)[1]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _assert_same(_results_and_grads(call, inputs, True)[1], plain)
