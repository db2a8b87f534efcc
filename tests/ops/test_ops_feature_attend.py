"""cpu_short_read (a short sequence's read from raw heads, on csrc/cpu/feature_attend.cpp) against the plain
composition it replaces, for each map with a row form there (DPFP-nu, ELU+1, Hedgehog, FAVOR+): the sum rule's
divide_by_z of (phi(q) phi(k)^T) [v; 1] (tril where causal), with padded keys' value rows zeroed. Outputs and
gradients of every input in float64, its products through BLAS and through the kernel's own loops, every width of nu,
padding, causal and not, the maps' exp where it underflows, gradcheck, no autograd; double backward refused; where it
does not run it says so (None); heads in the module's layout; the kernel's refusals. The delta rule's read:
test_ops_feature_attend_delta.py."""
import pytest
import torch

from fw_fairseq.ops import append_z_column, divide_by_z, feature_map
from fw_fairseq.ops.common.chunking import DELTA_ONE_CHUNK_MAX, SUM_CHUNK_SIZE
from fw_fairseq.ops.common.read_order import short_order
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS, cpu_kernel
from fw_fairseq.ops.rules import raw_read
from fw_fairseq.ops.rules.registry import RULES
from rule_runner import assert_read_matches
# products: the autouse fixture (every test through BLAS and through the kernel's own loops)
from short_read_cases import PLAIN, inputs, products, read, width  # noqa: F401


def sum_read(q, k, v, nu, causal, name="dpfp", pad=None):
    return read("sum", name, q, k, v, (), nu, causal, None, pad)


def plain(q, k, v, nu, causal, pad=None, name="dpfp"):
    """The composition the module runs without the kernel: phi formed, the z column appended, padded value rows
    zeroed (phi of a padded key may stay: it is multiplied by 0)."""
    u = append_z_column(v)
    if pad is not None:
        u = u.masked_fill(pad[:, None, :, None], 0.0)
    scores = PLAIN[name](q, nu, True) @ PLAIN[name](k, nu, False).transpose(-1, -2)
    return divide_by_z((scores.tril() if causal else scores) @ u)


@pytest.mark.parametrize("name", sorted(KERNEL_MAPS))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,H,Tq,T,d,nu,M", [(2, 3, 5, 7, 4, 2, 6), (1, 2, 9, 9, 3, 5, 8), (3, 2, 44, 44, 64, 2, 64),
                                             (2, 1, 13, 30, 8, 4, 40), (1, 1, 1, 1, 1, 1, 1)])
def test_matches_the_plain_composition(name, causal, B, H, Tq, T, d, nu, M):
    if causal and Tq != T:
        Tq = T
    q, k, v = inputs(B, H, Tq, T, d, M, seed=Tq * 31 + T)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[0, : T // 3] = True  # fairseq pads sources on the left
    ours, ref = sum_read(q, k, v, nu, causal, name, pad), plain(q, k, v, nu, causal, pad, name)
    if not causal and not short_order(Tq, T, width(name, d, nu), M + 1):
        assert ours is None  # the memory's order is the cheaper: the rule runs it
        return
    assert_read_matches(ours, ref, (q, k, v), dict(rtol=1e-10, atol=1e-12), dict(rtol=1e-9, atol=1e-11))


@pytest.mark.parametrize("name", sorted(KERNEL_MAPS))
def test_float32_is_close_to_float64(name):
    q, k, v = inputs(4, 2, 20, 20, 64, 64, seed=3)
    ref = plain(q, k, v, 2, True, name=name)
    ours = sum_read(*(x.detach().float() for x in (q, k, v)), 2, True, name)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-4, atol=1e-5)


def scaled_read_matches(name, scale, dtype, causal, seed, T):
    """The sum read of heads (d = 16) multiplied by `scale` (broadcast over [T, d]) in `dtype`, and its gradients,
    against the plain composition's (float32: to 1e-4)."""
    q, k, v = inputs(2, 2, T, T, 16, 8, seed=seed)
    q, k = ((x.detach() * scale).to(dtype).requires_grad_() for x in (q, k.flip(2)))
    v = v.detach().to(dtype).requires_grad_()
    ours, ref = sum_read(q, k, v, 2, causal, name), plain(q, k, v, 2, causal, name=name)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-4, atol=1e-5)
    assert_read_matches(ours, ref, (q, k, v), tol, tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", ["elu", "hedgehog", "favor"])
def test_the_maps_exp_where_it_underflows(name, dtype):
    """Heads of every scale up to 800 (ELU+1, Hedgehog and FAVOR+ take exp of x, of x less its largest entry, of
    R x' - |x'|^2 / 2): entries far below the largest give exp of 0 in the kernel as in torch, and the read and its
    gradients stay those of the plain composition."""
    scale = torch.logspace(-2, 2.9, 16, dtype=torch.float64)  # one scale per entry of a head
    scaled_read_matches(name, scale, dtype, True, seed=11, T=9)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name,dtype,top", [("favor", torch.float64, 2.5), ("favor", torch.float32, 1.5),
                                            ("hedgehog", torch.float64, 3.0), ("hedgehog", torch.float32, 2.5)])
def test_rows_on_both_sides_of_the_paired_exp(name, dtype, top, causal):
    """FAVOR+ and Hedgehog take exp(t) and exp(-t) from one range reduction where every |t| is at most a bound (80 in
    float32, 700 in float64; FAVOR+: t = u, with a key's |x'|^2 / 2 within it too; Hedgehog: t = x less the middle
    of the row's range), and each half's own exp past it: one scale per position, from 0.1 up, puts rows on both
    sides (with d = 16, max |u| ~ 5 and |x'|^2 / 2 ~ 2 times the scale squared, Hedgehog's half range ~ 2.5 times)."""
    scale = torch.logspace(-1, top, 12, dtype=torch.float64)[:, None]  # [T, 1]: one scale per position
    scaled_read_matches(name, scale, dtype, causal, seed=5, T=12)


@pytest.mark.parametrize("name", sorted(KERNEL_MAPS))
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck(name, causal):
    q, k, v = inputs(1, 2, 4, 4, 3, 8, seed=7)  # M = 8: the short order for every map
    assert torch.autograd.gradcheck(lambda *x: sum_read(*x, 2, causal, name), (q, k, v))


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


def test_every_map_offers_its_row_form():
    """raw_read.short_read of each map: the kernel's read with the map's own nu or R (FAVOR+'s float32 buffer)."""
    q, k, v = (x.detach() for x in inputs(1, 1, 3, 3, 4, 2, seed=5))
    for name in KERNEL_MAPS:  # the maps with a row form in the kernels
        phi = feature_map(name, 4, nu=2, m=3)
        ours = raw_read.short_read(phi, RULES["sum"], q, k, v, (), None, False, None)
        features = [phi(x, query) for x, query in ((q, True), (k, False))]
        u = append_z_column(v)
        torch.testing.assert_close(ours, divide_by_z(features[0] @ features[1].transpose(-1, -2) @ u), rtol=1e-10,
                                   atol=1e-12)


@pytest.mark.parametrize("rule,causal,T", [("sum", True, SUM_CHUNK_SIZE + 1), ("sum", False, 300),
                                           ("delta", True, DELTA_ONE_CHUNK_MAX + 1),
                                           ("delta", False, DELTA_ONE_CHUNK_MAX + 1), ("gated_delta", True, 5)])
def test_no_read_where_the_rule_takes_another_order(rule, causal, T):
    """Past one chunk, or a long non-causal read (the memory's order), or a rule without a read here: None."""
    q, k, v = (x.detach() for x in inputs(1, 1, T, T, 4, 2, seed=6))
    scalars = () if rule == "sum" else (torch.rand(1, 1, T, dtype=torch.float64),) * (1 if rule == "delta" else 2)
    assert read(rule, "dpfp", q, k, v, scalars, 2, causal, None if rule == "sum" else "l2") is None


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
    ours = read(rule, "dpfp", q, k, v, scalars, 2, True, norm)
    dq, dk = torch.autograd.grad(ours, (q, k), torch.ones_like(ours))
    assert dq.stride() == q.stride() and dk.stride() == k.stride()
    qc, kc, vc = (x.detach().contiguous().requires_grad_() for x in (q, k, v))
    ref = read(rule, "dpfp", qc, kc, vc, scalars, 2, True, norm)
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip((dq, dk), torch.autograd.grad(ref, (qc, kc), torch.ones_like(ref))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call,message", [
    (lambda kn, q, k: kn.feature_attend_forward(q, k[:, :, :2], None, 0, 2, None, True, 1e-6, True),
     "causal needs as many"),
    (lambda kn, q, k: kn.feature_attend_forward(q, k, None, 0, 9, None, False, 1e-6, True), "nu must be in 1..2d-1"),
    (lambda kn, q, k: kn.feature_attend_forward(q, k, None, 4, 1, None, False, 1e-6, True),
     "map must be 0 \\(dpfp\\), 1 \\(elu\\), 2 \\(hedgehog\\) or 3 \\(favor\\)"),
    (lambda kn, q, k: kn.feature_attend_forward(q, k, None, 3, 0, None, False, 1e-6, True),
     "favor needs its projection, \\[m, d\\] in q's dtype"),
    (lambda kn, q, k: kn.feature_attend_forward(q, k, None, 3, 0, torch.zeros(5, 3, dtype=q.dtype), False, 1e-6,
                                                True), "favor needs its projection"),
    (lambda kn, q, k: kn.delta_attend_forward(q, k, k, k[..., 0], 3, 0, torch.zeros(5, 4), True, 2, 1e-6, True),
     "favor needs its projection"),
    (lambda kn, q, k: kn.feature_attend_forward(q, k.float(), None, 0, 2, None, False, 1e-6, True), "share a dtype"),
    (lambda kn, q, k: kn.feature_attend_forward(q, k, torch.zeros(1, 1, dtype=torch.bool), 0, 2, None, False, 1e-6,
                                                True), "key_padding_mask must be \\[B, T\\]"),
    (lambda kn, q, k: kn.delta_attend_forward(q, k, k[:, :, :2], k[..., 0], 0, 2, None, True, 2, 1e-6, True),
     "v must be \\[B, H, T, M\\]"),
    (lambda kn, q, k: kn.delta_attend_forward(q, k, k, k[..., :2, 0], 0, 2, None, True, 2, 1e-6, True),
     "beta must be \\[B, H, T\\]"),
    (lambda kn, q, k: kn.delta_attend_forward(q, k, k.float(), k[..., 0], 0, 2, None, True, 2, 1e-6, True),
     "v and beta must have q's dtype"),
    (lambda kn, q, k: kn.delta_attend_forward(q, k, k, k[..., 0], 0, 2, None, True, 3, 1e-6, True), "norm must be 0"),
])
def test_the_kernel_refuses_what_it_cannot_compute(call, message):
    q, k, _ = (x.detach() for x in inputs(1, 1, 3, 3, 4, 2, seed=10))
    with pytest.raises(RuntimeError, match=message):
        call(cpu_kernel(q), q, k)
