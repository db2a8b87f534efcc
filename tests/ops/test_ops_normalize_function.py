"""NormalizeFunction (sum_normalize and l2_normalize eagerly) against the plain formula
x / max(norm, eps): outputs and gradients in float64, rows at, below and above eps (a clamped row's
gradient is g / eps), gradcheck, double backward refused, torch.compile's plain form."""
import pytest
import torch

from fw_fairseq.ops import l2_normalize, sum_normalize
from fw_fairseq.ops.maps.normalize_function import NormalizeFunction, norm_of

NORMS = {"sum": sum_normalize, "l2": l2_normalize}
EPS = 1e-6


def _plain(x, kind, eps=EPS):
    return x / norm_of(x, kind).clamp_min(eps)


def _grads(fn, x, upstream):
    x = x.detach().requires_grad_()
    y = fn(x)
    (dx,) = torch.autograd.grad(y, x, upstream)
    return y, dx


@pytest.mark.parametrize("kind", list(NORMS))
def test_matches_the_plain_formula(kind):
    g = torch.Generator().manual_seed(3)
    x = torch.rand(2, 3, 7, 10, generator=g, dtype=torch.float64)
    x[0, 0, 0] = 0  # a padded position: 0 stays 0
    x[0, 1, 2] = 1e-9  # a row whose norm is clamped at eps
    upstream = torch.randn(x.shape, generator=g, dtype=torch.float64).transpose(2, 3).contiguous().transpose(2, 3)
    expected, expected_dx = _grads(lambda t: _plain(t, kind), x, upstream)
    got, got_dx = _grads(NORMS[kind], x, upstream)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(got_dx, expected_dx, rtol=1e-10, atol=1e-12)
    assert (got[0, 0, 0] == 0).all()
    torch.testing.assert_close(got_dx[0, 1, 2], upstream[0, 1, 2] / EPS)


@pytest.mark.parametrize("kind", list(NORMS))
def test_gradcheck_and_double_backward_refused(kind):
    x = (torch.rand(3, 5, dtype=torch.float64) + 0.1).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: NormalizeFunction.apply(t, kind, EPS), (x,))
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(NORMS[kind](x).sum(), x, create_graph=True)


@pytest.mark.parametrize("kind", list(NORMS))
def test_compile_traces_the_plain_formula(kind):
    x = (torch.rand(4, 6, dtype=torch.float64) + 0.1).requires_grad_()
    compiled = torch.compile(NORMS[kind], backend="aot_eager", fullgraph=True)
    y = compiled(x)
    upstream = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, x, upstream)
    expected, expected_dx = _grads(lambda t: _plain(t, kind), x, upstream)
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(dx, expected_dx)
