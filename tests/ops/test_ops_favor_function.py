"""FavorFunction (FavorPlus eagerly) against the plain maths favor_plus: outputs and gradients in
float64 for queries (the row-max shift) and keys, strided inputs, gradcheck, no gradient for R,
double backward refused, the forward alone without autograd, torch.compile's plain form."""
import pytest
import torch

from fw_fairseq.ops import FavorPlus
from fw_fairseq.ops.maps.favor_function import FavorFunction
from fw_fairseq.ops.maps.favor_function import favor_plus


def _grads(fn, x, upstream):
    x = x.detach().requires_grad_()
    y = fn(x)
    (dx,) = torch.autograd.grad(y, x, upstream)
    return y, dx


@pytest.mark.parametrize("is_query", [True, False])
@pytest.mark.parametrize("d,m", [(1, 1), (6, 5), (16, 32)])
def test_matches_the_plain_maths(is_query, d, m):
    g = torch.Generator().manual_seed(d + m)
    projection = torch.randn(m, d, generator=g, dtype=torch.float64)
    x = 2 * torch.randn(3, 7, 2, d, generator=g, dtype=torch.float64).transpose(1, 2)  # strided
    upstream = torch.randn(3, 2, 7, 2 * m, generator=g, dtype=torch.float64)
    expected, expected_dx = _grads(lambda t: favor_plus(t, projection, is_query), x, upstream)
    got, got_dx = _grads(lambda t: FavorFunction.apply(t, projection, is_query), x, upstream)
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=0)
    torch.testing.assert_close(got_dx, expected_dx, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("is_query", [True, False])
def test_gradcheck_and_no_gradient_for_the_projection(is_query):
    projection = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: FavorFunction.apply(t, projection.detach(), is_query), (x,))
    FavorFunction.apply(x, projection, is_query).sum().backward()
    assert projection.grad is None
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(FavorFunction.apply(x, projection, is_query).sum(), x, create_graph=True)


def test_map_eager_no_grad_and_compiled_forms_agree():
    torch.manual_seed(0)
    phi = FavorPlus(8, 16).double()
    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    eager = phi(x, True)
    assert type(eager.grad_fn).__name__ == "FavorFunctionBackward"
    with torch.no_grad():
        alone = phi(x, True)
    assert alone.grad_fn is None
    compiled = torch.compile(lambda t: phi(t, True), backend="aot_eager", fullgraph=True)(x)
    plain = favor_plus(x, phi.projection.double(), True)
    for y in (eager, alone, compiled):
        torch.testing.assert_close(y, plain, rtol=1e-13, atol=0)
