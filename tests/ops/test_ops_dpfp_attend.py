"""dpfp_sum_read (the sum rule's read with DPFP features from raw heads, on cpu/dpfp_attend.cpp) against the plain
composition it replaces: divide_by_z of (dpfp(q) dpfp(k)^T) [v; 1] (tril where causal), with padded keys' value rows
zeroed. Outputs and gradients of q, k and v in float64, its products through BLAS and through the kernel's own loops,
every width of nu, padding, causal and not, gradcheck, no autograd; double backward refused; where it does not run it
says so (None)."""
import pytest
import torch

from fw_fairseq.ops import append_z_column, divide_by_z, dpfp, dpfp_attend, feature_map
from fw_fairseq.ops.cpu_extension import cpu_kernel


@pytest.fixture(autouse=True, params=[True, False], ids=["blas", "loops"])
def products(request, monkeypatch):
    if cpu_kernel(torch.zeros(1)) is None:
        pytest.skip("fw_fairseq._cpu is not built")
    if request.param and not cpu_kernel(torch.zeros(1)).dpfp_attend_blas():
        pytest.skip("the loaded torch exports no BLAS")
    monkeypatch.setattr(dpfp_attend, "BLAS", request.param)


def plain(q, k, v, nu, causal, pad=None):
    """The composition the module ran before: phi formed, the z column appended, padded value rows zeroed."""
    u = append_z_column(v)
    if pad is not None:
        u = u.masked_fill(pad[:, None, :, None], 0.0)
    scores = dpfp(q, nu) @ dpfp(k, nu).transpose(-1, -2)
    return divide_by_z((scores.tril() if causal else scores) @ u)


def inputs(B, H, Tq, T, d, M, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, w, generator=g, dtype=dtype).requires_grad_() for n, w in ((Tq, d), (T, d), (T, M))]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Tq,T,d,nu,M", [(2, 3, 5, 7, 4, 2, 6), (1, 2, 9, 9, 3, 5, 2), (3, 2, 44, 44, 64, 2, 64),
                                             (2, 1, 13, 30, 8, 1, 5), (1, 1, 1, 1, 1, 1, 1)])
def test_matches_the_plain_composition(causal, B, H, Tq, T, d, nu, M):
    if causal and Tq != T:
        Tq = T
    q, k, v = inputs(B, H, Tq, T, d, M, seed=Tq * 31 + T)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, : T // 3] = True  # fairseq pads sources on the left
    ours, ref = dpfp_attend.dpfp_sum_read(q, k, v, nu, causal, pad), plain(q, k, v, nu, causal, pad)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    upstream = torch.randn_like(ref)
    for g_ours, g_ref in zip(torch.autograd.grad(ours, (q, k, v), upstream),
                             torch.autograd.grad(ref, (q, k, v), upstream)):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-9, atol=1e-11)


def test_float32_is_close_to_float64():
    q, k, v = inputs(4, 2, 20, 20, 64, 64, seed=3)
    ref = plain(q, k, v, 2, causal=True)
    ours = dpfp_attend.dpfp_sum_read(*(x.detach().float() for x in (q, k, v)), 2, True)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = inputs(1, 2, 4, 4, 3, 2, seed=7)
    assert torch.autograd.gradcheck(lambda *x: dpfp_attend.dpfp_sum_read(*x, 2, causal), (q, k, v))


def test_without_autograd_it_reads_the_same():
    q, k, v = inputs(2, 2, 6, 8, 5, 3, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(dpfp_attend.dpfp_sum_read(q, k, v, 2, False), plain(q, k, v, 2, False),
                                   rtol=1e-10, atol=1e-12)


def test_double_backward_is_refused():
    q, k, v = inputs(1, 1, 3, 3, 2, 2, seed=2)
    (dq,) = torch.autograd.grad(dpfp_attend.dpfp_sum_read(q, k, v, 1, False).sum(), q, create_graph=False)
    assert dq.shape == q.shape
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(dpfp_attend.dpfp_sum_read(q, k, v, 1, False).sum(), q, create_graph=True)


@pytest.mark.parametrize("case", ["half", "empty", "dtypes"])
def test_where_it_does_not_run_it_says_none(case):
    q, k, v = (x.detach() for x in inputs(1, 1, 3, 3, 2, 2, seed=4))
    if case == "half":
        q, k, v = (x.half() for x in (q, k, v))
    elif case == "empty":
        k, v = k[:, :, :0], v[:, :, :0]
    else:
        q = q.float()
    assert dpfp_attend.dpfp_sum_read(q, k, v, 1, False) is None


def test_the_map_offers_it_and_the_others_do_not():
    q, k, v = (x.detach() for x in inputs(1, 1, 3, 3, 4, 2, seed=5))
    assert feature_map("dpfp", 4, nu=2).sum_read(q, k, v, None, False) is not None
    for name in ("elu", "hedgehog", "favor"):
        assert feature_map(name, 4, m=4).sum_read(q, k, v, None, False) is None
