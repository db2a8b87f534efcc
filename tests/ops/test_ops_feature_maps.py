"""Feature maps: widths, positivity, DPFP by hand, FAVOR+ buffer/redraw/approximation, sum_normalize."""
import math

import pytest
import torch

from fw_fairseq.ops import PHI_NORMS, FavorPlus, dpfp, elu_plus_one, l2_normalize, sum_normalize


def test_elu_plus_one_dims_and_positivity():
    x = 5 * torch.randn(2, 3, 7, 8, dtype=torch.float64)
    phi = elu_plus_one(x)
    assert phi.shape == x.shape and phi.dtype == torch.float64
    assert (phi > 0).all()
    torch.testing.assert_close(phi[x > 0], x[x > 0] + 1)


@pytest.mark.parametrize("d,nu", [(1, 1), (4, 1), (4, 3), (8, 15), (64, 2)])
def test_dpfp_dims_and_non_negativity(d, nu):
    x = torch.randn(2, 3, 5, d, dtype=torch.float64)
    phi = dpfp(x, nu)
    assert phi.shape == (2, 3, 5, 2 * d * nu) and phi.dtype == torch.float64
    assert (phi >= 0).all()


def test_dpfp_hand_example():
    # r = [relu(x), relu(-x)] = [1, 0, 0, 0, 2, 3]
    x = torch.tensor([1.0, -2.0, -3.0])
    # roll 1: [3, 1, 0, 0, 0, 2] -> r * roll = [3, 0, 0, 0, 0, 6]
    # roll 2: [2, 3, 1, 0, 0, 0] -> r * roll = [2, 0, 0, 0, 0, 0]
    expected = torch.tensor([3.0, 0, 0, 0, 0, 6, 2, 0, 0, 0, 0, 0])
    torch.testing.assert_close(dpfp(x, 2), expected)


def test_dpfp_matches_paper_listing():
    # Appendix C, Listing 1 of the paper
    x = torch.randn(3, 6, dtype=torch.float64)
    r = torch.cat([torch.relu(x), torch.relu(-x)], dim=-1)
    nu = 3
    listing = torch.cat([r] * nu, dim=-1) * torch.cat([r.roll(shifts=j, dims=-1) for j in range(1, nu + 1)], dim=-1)
    torch.testing.assert_close(dpfp(x, nu), listing)


@pytest.mark.parametrize("nu", [0, -1, 8, 2.0, True, "2"])
def test_dpfp_rejects_bad_nu(nu):
    with pytest.raises(ValueError, match=r"nu=.*1\.\.7"):
        dpfp(torch.randn(2, 4), nu)


def test_sum_normalize_rows_sum_to_one_and_zero_rows_stay_zero():
    x = torch.rand(4, 6, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        x[1] = 0  # a padded position
    y = sum_normalize(x)
    torch.testing.assert_close(y.sum(-1)[[0, 2, 3]], torch.ones(3, dtype=torch.float64))
    assert (y[1] == 0).all()
    (grad,) = torch.autograd.grad(y, x, torch.randn_like(y))
    assert torch.isfinite(grad).all()


def test_l2_normalize_gives_unit_rows_so_a_delta_write_overwrites_exactly():
    x = torch.rand(4, 6, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        x[1] = 0  # a padded position
    k = l2_normalize(x)
    torch.testing.assert_close(k.norm(dim=-1)[[0, 2, 3]], torch.ones(3, dtype=torch.float64))
    assert (k[1] == 0).all()
    (grad,) = torch.autograd.grad(k, x, torch.randn_like(k))
    assert torch.isfinite(grad).all()
    # W' = W + k^T (v - k W) with a unit k reads back v exactly; a sum-normalised k does not
    W, v = torch.randn(6, 3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    for norm, exact in ((l2_normalize, True), (sum_normalize, False)):
        key = norm(x[0].detach())
        written = W + torch.outer(key, v - key @ W)
        assert torch.allclose(key @ written, v) is exact
    assert PHI_NORMS == {"sum": sum_normalize, "l2": l2_normalize}


def test_favor_dims_dtype_and_positivity():
    favor = FavorPlus(head_dim=8, num_features=12)
    assert favor.projection.shape == (12, 8)
    x = 3 * torch.randn(2, 3, 5, 8)
    for is_query in (False, True):
        phi = favor(x, is_query=is_query)
        assert phi.shape == (2, 3, 5, 24) and phi.dtype == torch.float32
        assert (phi > 0).all() and torch.isfinite(phi).all()
    assert favor(x.half(), is_query=False).dtype == torch.float32  # fp16 would overflow exp
    assert favor(x.bfloat16(), is_query=True).dtype == torch.float32
    assert favor.double()(x.double(), is_query=False).dtype == torch.float64


def test_favor_projection_rows_block_orthogonal():
    favor = FavorPlus(head_dim=4, num_features=10)  # blocks of 4, 4 and 2 rows
    directions = torch.nn.functional.normalize(favor.projection, dim=-1)
    for start, stop in [(0, 4), (4, 8), (8, 10)]:
        block = directions[start:stop]
        torch.testing.assert_close(block @ block.T, torch.eye(stop - start), atol=1e-5, rtol=0)


def test_favor_fixed_in_eval_and_changes_on_redraw():
    favor = FavorPlus(head_dim=8, num_features=16).eval()
    x = torch.randn(4, 8)
    torch.testing.assert_close(favor(x, False), favor(x, False))
    favor.train()  # forward itself never redraws, in training either
    torch.testing.assert_close(favor(x, False), favor(x, False))
    before, buffer = favor.projection.clone(), favor.projection
    favor.redraw()
    assert favor.projection is buffer  # in place: same tensor, device and dtype
    assert not torch.allclose(before, favor.projection)
    assert not torch.allclose(favor(x, False), FavorPlus(8, 16)(x, False))


def test_favor_projection_is_in_state_dict():
    favor = FavorPlus(head_dim=8, num_features=16)
    state = favor.state_dict()
    assert "projection" in state
    other = FavorPlus(head_dim=8, num_features=16)
    other.load_state_dict(state)
    x = torch.randn(3, 8)
    torch.testing.assert_close(other(x, True), favor(x, True))


def test_favor_approximates_softmax_kernel_float64():
    torch.manual_seed(0)
    d = 16
    favor = FavorPlus(head_dim=d, num_features=8192).double()
    q, k = 0.5 * torch.randn(6, d, dtype=torch.float64), 0.5 * torch.randn(6, d, dtype=torch.float64)
    approx = favor(q, is_query=False) @ favor(k, is_query=False).T  # [6, 6]
    exact = torch.exp(q @ k.T / math.sqrt(d))
    assert ((approx - exact).abs() / exact).max() < 0.15


def test_favor_query_shift_cancels_after_normalisation():
    torch.manual_seed(0)
    favor = FavorPlus(head_dim=8, num_features=32).double()
    q, k = torch.randn(5, 8, dtype=torch.float64), torch.randn(7, 8, dtype=torch.float64)
    scores_shifted = favor(q, True) @ favor(k, False).T  # [5, 7]
    scores = favor(q, False) @ favor(k, False).T  # the key path applies no per-row shift
    torch.testing.assert_close(sum_normalize(scores_shifted), sum_normalize(scores))
    assert (favor(q, True) <= 1 / math.sqrt(64) + 1e-12).all()  # max exponent is 0


def test_favor_keys_bounded_for_large_inputs():
    favor = FavorPlus(head_dim=64, num_features=32)
    phi = favor(100 * torch.randn(10, 64), is_query=False)
    assert torch.isfinite(phi).all()


@pytest.mark.parametrize("kwargs,match", [
    (dict(head_dim=8, num_features=0), "num_features=0"),
    (dict(head_dim=0, num_features=4), "head_dim=0"),
    (dict(head_dim=8, num_features=2.5), "num_features=2.5"),
])
def test_favor_rejects_bad_sizes(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FavorPlus(**kwargs)


def test_favor_rejects_wrong_input_width():
    with pytest.raises(ValueError, match="head_dim=8"):
        FavorPlus(8, 4)(torch.randn(2, 7), is_query=True)
