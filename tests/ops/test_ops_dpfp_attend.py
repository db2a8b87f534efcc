"""dpfp_short_read (a short sequence's read with DPFP features from raw heads, on cpu/dpfp_attend.cpp) against the
plain compositions it replaces. The sum rule: divide_by_z of (dpfp(q) dpfp(k)^T) [v; 1] (tril where causal), with
padded keys' value rows zeroed; the causal delta rule: fast_weight_delta of normalised features, with padded
positions at beta = 0. Outputs and gradients of every input in float64, its products through BLAS and through the
kernel's own loops, every width of nu, padding, causal and not, both norms, gradcheck, no autograd; double backward
refused; where it does not run it says so (None)."""
import pytest
import torch

from fw_fairseq.ops import PHI_NORMS, append_z_column, divide_by_z, dpfp, dpfp_attend, fast_weight_delta, feature_map
from fw_fairseq.ops.chunked import DELTA_ONE_CHUNK_MAX, SUM_CHUNK_SIZE
from fw_fairseq.ops.cpu_extension import cpu_kernel


@pytest.fixture(autouse=True, params=[True, False], ids=["blas", "loops"])
def products(request, monkeypatch):
    if cpu_kernel(torch.zeros(1)) is None:
        pytest.skip("fw_fairseq._cpu is not built")
    if request.param and not cpu_kernel(torch.zeros(1)).dpfp_attend_blas():
        pytest.skip("the loaded torch exports no BLAS")
    monkeypatch.setattr(dpfp_attend, "BLAS", request.param)


def sum_read(q, k, v, nu, causal):
    return dpfp_attend.dpfp_short_read("sum", q, k, v, (), nu, causal, None)


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
@pytest.mark.parametrize("B,H,Tq,T,d,nu,M", [(2, 3, 5, 7, 4, 2, 6), (1, 2, 9, 9, 3, 5, 8), (3, 2, 44, 44, 64, 2, 64),
                                             (2, 1, 13, 30, 8, 4, 40), (1, 1, 1, 1, 1, 1, 1)])
def test_matches_the_plain_composition(causal, B, H, Tq, T, d, nu, M):
    if causal and Tq != T:
        Tq = T
    q, k, v = inputs(B, H, Tq, T, d, M, seed=Tq * 31 + T)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, : T // 3] = True  # fairseq pads sources on the left
    ours, ref = dpfp_attend.dpfp_short_read("sum", q, k, v, (), nu, causal, None, pad), plain(q, k, v, nu, causal, pad)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    upstream = torch.randn_like(ref)
    for g_ours, g_ref in zip(torch.autograd.grad(ours, (q, k, v), upstream),
                             torch.autograd.grad(ref, (q, k, v), upstream)):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-9, atol=1e-11)


def test_float32_is_close_to_float64():
    q, k, v = inputs(4, 2, 20, 20, 64, 64, seed=3)
    ref = plain(q, k, v, 2, causal=True)
    ours = sum_read(*(x.detach().float() for x in (q, k, v)), 2, True)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(causal):
    q, k, v = inputs(1, 2, 4, 4, 3, 2, seed=7)
    assert torch.autograd.gradcheck(lambda *x: sum_read(*x, 2, causal), (q, k, v))


def test_without_autograd_it_reads_the_same():
    q, k, v = inputs(2, 2, 6, 8, 5, 8, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(sum_read(q, k, v, 2, False), plain(q, k, v, 2, False),
                                   rtol=1e-10, atol=1e-12)


def test_double_backward_is_refused():
    q, k, v = inputs(1, 1, 3, 3, 2, 2, seed=2)
    (dq,) = torch.autograd.grad(sum_read(q, k, v, 1, False).sum(), q, create_graph=False)
    assert dq.shape == q.shape
    with pytest.raises(RuntimeError, match="create_graph=True"):
        torch.autograd.grad(sum_read(q, k, v, 1, False).sum(), q, create_graph=True)


@pytest.mark.parametrize("case", ["half", "empty", "dtypes"])
def test_where_it_does_not_run_it_says_none(case):
    q, k, v = (x.detach() for x in inputs(1, 1, 3, 3, 2, 2, seed=4))
    if case == "half":
        q, k, v = (x.half() for x in (q, k, v))
    elif case == "empty":
        k, v = k[:, :, :0], v[:, :, :0]
    else:
        q = q.float()
    assert sum_read(q, k, v, 1, False) is None


def test_the_map_offers_it_and_the_others_do_not():
    q, k, v = (x.detach() for x in inputs(1, 1, 3, 3, 4, 2, seed=5))
    assert feature_map("dpfp", 4, nu=2).short_read("sum", q, k, v, (), None, False, None) is not None
    for name in ("elu", "hedgehog", "favor"):
        assert feature_map(name, 4, m=4).short_read("sum", q, k, v, (), None, False, None) is None


@pytest.mark.parametrize("rule,causal,T", [("sum", True, SUM_CHUNK_SIZE + 1), ("sum", False, 300),
                                           ("delta", True, DELTA_ONE_CHUNK_MAX + 1), ("delta", False, 5),
                                           ("gated_delta", True, 5)])
def test_no_read_where_the_rule_takes_another_order(rule, causal, T):
    """Past one chunk, or a long non-causal read (the memory's order), or a rule without a read here: None."""
    q, k, v = (x.detach() for x in inputs(1, 1, T, T, 4, 2, seed=6))
    scalars = () if rule == "sum" else (torch.rand(1, 1, T, dtype=torch.float64),) * (1 if rule == "delta" else 2)
    assert dpfp_attend.dpfp_short_read(rule, q, k, v, scalars, 2, causal, None if rule == "sum" else "l2") is None


def delta_plain(q, k, v, beta, nu, norm):
    return fast_weight_delta(PHI_NORMS[norm](dpfp(q, nu)), PHI_NORMS[norm](dpfp(k, nu)), v, beta)[0]


@pytest.mark.parametrize("norm", ["l2", "sum"])
@pytest.mark.parametrize("B,H,T,d,nu,M", [(2, 3, 7, 4, 2, 6), (1, 2, 9, 3, 5, 2), (3, 2, 44, 64, 2, 64),
                                         (1, 1, 1, 2, 1, 1), (2, 1, DELTA_ONE_CHUNK_MAX, 8, 2, 5)])
def test_delta_matches_the_rule_on_normalised_features(norm, B, H, T, d, nu, M):
    q, k, v = inputs(B, H, T, T, d, M, seed=T * 7 + d)
    g = torch.Generator().manual_seed(T)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    beta[0, :, T // 2:] = 0  # padded positions: beta 0 and zero values write nothing
    v = v.detach().clone()
    v[0, :, T // 2:] = 0
    beta, v = beta.requires_grad_(), v.requires_grad_()
    ours = dpfp_attend.dpfp_short_read("delta", q, k, v, (beta,), nu, True, norm)
    ref = delta_plain(q, k, v, beta, nu, norm)
    torch.testing.assert_close(ours, ref, rtol=1e-10, atol=1e-12)
    upstream = torch.randn_like(ref)
    for g_ours, g_ref in zip(torch.autograd.grad(ours, (q, k, v, beta), upstream),
                             torch.autograd.grad(ref, (q, k, v, beta), upstream)):
        torch.testing.assert_close(g_ours, g_ref, rtol=1e-8, atol=1e-10)


def test_delta_gradcheck_and_no_autograd():
    q, k, v = inputs(1, 2, 4, 4, 3, 2, seed=8)
    beta = torch.rand(1, 2, 4, dtype=torch.float64, requires_grad=True)
    read = lambda *x: dpfp_attend.dpfp_short_read("delta", *x[:3], (x[3],), 2, True, "l2")  # noqa: E731
    assert torch.autograd.gradcheck(read, (q, k, v, beta))
    with torch.no_grad():
        torch.testing.assert_close(read(q, k, v, beta), delta_plain(q, k, v, beta, 2, "l2"), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_heads_in_the_modules_layout_are_read_and_written_in_place(rule):
    """The module's heads are views of [T, B, C]: the kernel reads them as they lie and returns dq and dk in that
    layout (no copy either way), with the same values as for contiguous heads."""
    g = torch.Generator().manual_seed(9)
    T, B, H, d = 6, 3, 2, 4
    q, k, v = (torch.randn(T, B, H, d, generator=g, dtype=torch.float64).permute(1, 2, 0, 3).requires_grad_()
               for _ in range(3))
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    scalars, norm = ((), None) if rule == "sum" else ((beta,), "l2")
    ours = dpfp_attend.dpfp_short_read(rule, q, k, v, scalars, 2, True, norm)
    dq, dk = torch.autograd.grad(ours, (q, k), torch.ones_like(ours))
    assert dq.stride() == q.stride() and dk.stride() == k.stride()
    qc, kc, vc = (x.detach().contiguous().requires_grad_() for x in (q, k, v))
    ref = dpfp_attend.dpfp_short_read(rule, qc, kc, vc, scalars, 2, True, norm)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip((dq, dk), torch.autograd.grad(ref, (qc, kc), torch.ones_like(ref))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call,message", [
    (lambda kn, q, k: kn.dpfp_attend_forward(q, k, None, 2, 1, False, 0, 1e-6, True), "the products \\(kind 1\\) are causal"),
    (lambda kn, q, k: kn.dpfp_attend_forward(q, k[:, :, :2], None, 2, 0, True, 0, 1e-6, True), "causal needs as many"),
    (lambda kn, q, k: kn.dpfp_attend_forward(q, k, None, 9, 0, False, 0, 1e-6, True), "nu must be in 1..2d-1"),
    (lambda kn, q, k: kn.dpfp_attend_forward(q, k.float(), None, 2, 0, False, 0, 1e-6, True), "share a dtype"),
    (lambda kn, q, k: kn.dpfp_attend_forward(q, k, torch.zeros(1, 1, dtype=torch.bool), 2, 0, False, 0, 1e-6, True),
     "key_padding_mask must be \\[B, T\\]"),
])
def test_the_kernel_refuses_what_it_cannot_compute(call, message):
    q, k, _ = (x.detach() for x in inputs(1, 1, 3, 3, 4, 2, seed=10))
    with pytest.raises(RuntimeError, match=message):
        call(cpu_kernel(q), q, k)
