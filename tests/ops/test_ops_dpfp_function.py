"""DpfpFunction (the Dpfp map's eager form) against the plain maths of dpfp, in both of its forms (the
compiled CPU kernel, fw_fairseq._cpu, and the PyTorch form): outputs and gradients in float64 for every
width of nu, exact zeros (relu's gradient at 0), strided inputs and upstream gradients, an empty batch,
half precision; gradcheck; double backward refused; torch.compile's plain form; the kernel is built
wherever a C++ compiler was there at install time."""
import importlib.util
import shutil

import pytest
import torch

from fw_fairseq.decoding.key_cache import key_cache
from fw_fairseq.ops import dpfp, feature_map
from fw_fairseq.ops.maps import dpfp_function
from fw_fairseq.ops.maps.normalize_function import PHI_NORMS
from fw_fairseq.ops.maps.dpfp_function import DpfpFunction


@pytest.fixture(autouse=True)
def form(cpu_form):
    """Every test runs with the compiled kernel and again with the PyTorch form (conftest's cpu_form)."""
    return cpu_form


def test_the_kernel_is_built_where_a_compiler_is():
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler: the install skips the optional CPU extension")
    assert importlib.util.find_spec("fw_fairseq._cpu") is not None, "csrc/cpu/ was not built (make setup)"


def _grads(fn, x, upstream):
    x = x.detach().requires_grad_()
    y = fn(x)
    (dx,) = torch.autograd.grad(y, x, upstream)
    return y, dx


@pytest.mark.parametrize("d,nu", [(1, 1), (3, 1), (3, 5), (4, 2), (8, 15), (16, 3), (64, 2)])
def test_matches_plain_dpfp_outputs_and_gradients(d, nu):
    g = torch.Generator().manual_seed(d * 100 + nu)
    x = torch.randn(2, 3, 5, d, generator=g, dtype=torch.float64)
    x[0, 0, 0, :] = 0  # a padded position: relu's gradient at 0 is 0 on both sides
    x[1, 2, 3, 0] = 0
    upstream = torch.randn(2, 3, 5, 2 * d * nu, generator=g, dtype=torch.float64)
    expected, expected_dx = _grads(lambda t: dpfp(t, nu), x, upstream)
    got, got_dx = _grads(lambda t: DpfpFunction.apply(t, nu), x, upstream)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)  # the same products, in the same order
    torch.testing.assert_close(got_dx, expected_dx, rtol=1e-12, atol=1e-12)


def test_strided_input_and_upstream_gradient():
    x = torch.randn(5, 4, 6, dtype=torch.float64).transpose(0, 1)  # [4, 5, 6], not contiguous
    upstream = torch.randn(4, 24, 5, dtype=torch.float64).transpose(1, 2)  # [4, 5, 24], not contiguous
    expected, expected_dx = _grads(lambda t: dpfp(t, 2), x, upstream)
    got, got_dx = _grads(lambda t: DpfpFunction.apply(t, 2), x, upstream)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    torch.testing.assert_close(got_dx, expected_dx, rtol=1e-12, atol=1e-12)


def test_gradcheck():
    x = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: DpfpFunction.apply(t, 3), (x,))


def test_empty_batch_and_half_precision():
    empty = torch.randn(0, 2, 4, requires_grad=True)
    y = DpfpFunction.apply(empty, 2)
    assert y.shape == (0, 2, 16)
    y.sum().backward()
    assert empty.grad.shape == empty.shape
    x = torch.randn(3, 8, dtype=torch.float16)
    torch.testing.assert_close(DpfpFunction.apply(x, 2), dpfp(x, 2), rtol=0, atol=0)


def test_double_backward_is_refused():
    x = torch.randn(2, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(DpfpFunction.apply(x, 2).sum(), x, create_graph=True)


def test_map_uses_the_function_eagerly_and_the_plain_maths_under_compile():
    phi = feature_map("dpfp", 4, nu=2)
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert type(phi(x, False).grad_fn).__name__ == "DpfpFunctionBackward"
    compiled = torch.compile(lambda t: phi(t, False), backend="aot_eager", fullgraph=True)
    y = compiled(x)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    expected, expected_dx = _grads(lambda t: dpfp(t, 2), x, torch.ones_like(y))
    torch.testing.assert_close(y, expected)
    torch.testing.assert_close(dx, expected_dx)


def test_without_autograd_the_map_runs_the_forward_alone():
    phi = feature_map("dpfp", 8, nu=3)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    with torch.no_grad():
        y = phi(x.requires_grad_(), False)
    assert y.grad_fn is None
    torch.testing.assert_close(y, dpfp(x.detach(), 3), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("d,nu,rows,t", [(1, 1, 1, 3), (3, 5, 2, 7), (8, 2, 3, 1), (64, 2, 2, 9), (5, 3, 1, 0)])
def test_scores_from_raw_keys_match_the_features(d, nu, rows, t, dtype):
    """dpfp_scores (the decoding cache's read) = rows . dpfp(keys), with the keys a cache's view of its
    first t positions (strided on B, H and t) and exact zeros among them."""
    g = torch.Generator().manual_seed(d * 10 + t)
    storage = torch.randn(3, 2, t + 4, d, generator=g, dtype=dtype)
    keys = storage[:2, :, :t]  # [2, 2, t, d]
    if t:
        keys[0, 1, 0] = 0
    q = torch.randn(2, 2, rows, 2 * d * nu, generator=g, dtype=dtype)
    expected = q @ dpfp(keys, nu).transpose(-1, -2)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(dpfp_function.dpfp_scores(q, keys, nu), expected, rtol=tolerance, atol=tolerance)
    # keys whose last dim is strided are read as well
    torch.testing.assert_close(dpfp_function.dpfp_scores(q, keys.transpose(-1, -2).contiguous().transpose(-1, -2),
                                                         nu), expected, rtol=tolerance, atol=tolerance)


def test_the_map_scores_its_cached_keys_with_gradients_through_the_features():
    """Dpfp keeps raw keys in a decoding cache; with autograd its scores are differentiable (the plain
    product with its features), without it the kernel's: the same values."""
    phi = feature_map("dpfp", 4, nu=2)
    keys = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    q = torch.randn(2, 3, 2, 16, dtype=torch.float64, requires_grad=True)
    cache = key_cache(phi)
    assert cache.width == 4 and cache.row(keys, None) is keys
    got = cache.scores(q, keys)
    expected = q @ dpfp(keys, 2).transpose(-1, -2)
    upstream = torch.randn_like(expected)
    for a, b in zip(torch.autograd.grad(got, (q, keys), upstream), torch.autograd.grad(expected, (q, keys), upstream)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(cache.scores(q, keys), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["sum", "l2"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_normalised_forward_matches_the_normalisation_of_the_map(kind, dtype):
    """Without autograd the map and --fw-delta-norm's normalisation run in one pass (all-zero rows stay 0);
    with it, the Functions of each: the same values, and gradients through the second."""
    from fw_fairseq.ops import PHI_NORMS

    phi = feature_map("dpfp", 6, nu=3)
    x = torch.randn(2, 3, 4, 6, dtype=dtype)
    x[0, 0, 0] = 0  # a padded position: phi = 0, clamped at eps, 0 out
    x[1, 1, 1] = 1e-5  # tiny: sum(phi) below eps
    expected = PHI_NORMS[kind](dpfp(x, 3))
    tolerance = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(phi.normalized(x, False, kind), expected, rtol=tolerance, atol=tolerance)
    assert torch.count_nonzero(phi.normalized(x, False, kind)[0, 0, 0]) == 0
    leaf = x.clone().requires_grad_()
    got = phi.normalized(leaf, False, kind)
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)
    assert got.grad_fn is not None


@pytest.mark.parametrize("norm", ["sum", "l2"])
@pytest.mark.parametrize("d,nu", [(1, 1), (3, 5), (16, 3), (64, 2)])
def test_normalised_in_one_function_matches_the_map_then_the_normalisation(d, nu, norm):
    """--fw-delta-norm's phi / max(norm, eps) in DpfpFunction (the kernel fuses it into the map both ways)
    = the plain maths, with an all-zero row (its norm clamped at eps) and strided upstream gradients."""
    g = torch.Generator().manual_seed(d * 7 + nu)
    x = torch.randn(2, 3, 5, d, generator=g, dtype=torch.float64)
    x[0, 0, 0, :] = 0  # phi = 0: the norm is clamped, the gradient divided by the constant eps
    upstream = torch.randn(2, 3, 2 * d * nu, 5, generator=g, dtype=torch.float64).transpose(-1, -2)
    expected, expected_dx = _grads(lambda t: PHI_NORMS[norm](dpfp(t, nu)), x, upstream)
    got, got_dx = _grads(lambda t: DpfpFunction.apply(t, nu, norm), x, upstream)
    torch.testing.assert_close(got, expected, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(got_dx, expected_dx, rtol=1e-11, atol=1e-11)
    phi = feature_map("dpfp", d, nu=nu)
    assert type(phi.normalized(x.requires_grad_(), False, norm).grad_fn).__name__ == "DpfpFunctionBackward"
    x = torch.randn(2, 4, d, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: DpfpFunction.apply(t, nu, norm), (x,))
