"""cpu_short_read of the delta rule (csrc/cpu/delta_attend.cpp) against the rule's own functions on normalised
features, for each map with a row form there: causal (fast_weight_delta) and not (fast_weight_attend, every query
reading the memory after the last write), padded positions at beta = 0 and zero values, both norms. Outputs and
gradients of every input and beta in float64, through BLAS and through the kernel's own loops; gradcheck, no
autograd."""
import pytest
import torch

from fw_fairseq.ops import PHI_NORMS, fast_weight_attend, fast_weight_delta
from fw_fairseq.ops.common.chunking import DELTA_ONE_CHUNK_MAX
from fw_fairseq.ops.common.read_order import short_order
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS
from rule_runner import assert_read_matches
# products: the autouse fixture (every test through BLAS and through the kernel's own loops)
from short_read_cases import PLAIN, inputs, products, read, width  # noqa: F401


def delta_plain(q, k, v, beta, nu, norm, name="dpfp"):
    phi = PLAIN[name]
    return fast_weight_delta(PHI_NORMS[norm](phi(q, nu, True)), PHI_NORMS[norm](phi(k, nu, False)), v, beta)[0]


@pytest.mark.parametrize("name", sorted(KERNEL_MAPS))
@pytest.mark.parametrize("norm", ["l2", "sum"])
@pytest.mark.parametrize("B,H,T,d,nu,M", [(2, 3, 7, 4, 2, 6), (1, 2, 9, 3, 5, 2), (3, 2, 44, 64, 2, 64),
                                         (1, 1, 1, 2, 1, 1), (2, 1, DELTA_ONE_CHUNK_MAX, 8, 2, 5)])
def test_delta_matches_the_rule_on_normalised_features(name, norm, B, H, T, d, nu, M):
    q, k, v = inputs(B, H, T, T, d, M, seed=T * 7 + d)
    g = torch.Generator().manual_seed(T)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    beta[0, :, T // 2:] = 0  # padded positions: beta 0 and zero values write nothing
    v = v.detach().clone()
    v[0, :, T // 2:] = 0
    beta, v = beta.requires_grad_(), v.requires_grad_()
    ours = read("delta", name, q, k, v, (beta,), nu, True, norm)
    ref = delta_plain(q, k, v, beta, nu, norm, name)
    assert_read_matches(ours, ref, (q, k, v, beta), dict(rtol=1e-10, atol=1e-12), dict(rtol=1e-8, atol=1e-10))


@pytest.mark.parametrize("name", sorted(KERNEL_MAPS))
def test_delta_gradcheck_and_no_autograd(name):
    q, k, v = inputs(1, 2, 4, 4, 3, 2, seed=8)
    beta = torch.rand(1, 2, 4, dtype=torch.float64, requires_grad=True)
    delta = lambda *x: read("delta", name, *x[:3], (x[3],), 2, True, "l2")  # noqa: E731
    assert torch.autograd.gradcheck(delta, (q, k, v, beta))
    with torch.no_grad():
        torch.testing.assert_close(delta(q, k, v, beta), delta_plain(q, k, v, beta, 2, "l2", name), rtol=1e-10,
                                   atol=1e-12)


@pytest.mark.parametrize("name", sorted(KERNEL_MAPS))
@pytest.mark.parametrize("B,H,Tq,T,d,nu,M", [(2, 3, 5, 7, 4, 2, 16), (1, 2, 9, 4, 3, 1, 24), (3, 2, 30, 44, 64, 2, 64)])
def test_non_causal_delta_matches_fast_weight_attend(name, B, H, Tq, T, d, nu, M):
    """Encoder self- and teacher-forced cross-attention: every query reads the memory after the last write
    (fast_weight_attend, the rule's function), Tq != T, padded positions at beta = 0 and zero values."""
    q, k, v = inputs(B, H, Tq, T, d, M, seed=Tq * 5 + T)
    g = torch.Generator().manual_seed(T)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    beta[0, :, : T // 3] = 0  # fairseq pads sources on the left
    v = v.detach().clone()
    v[0, :, : T // 3] = 0
    beta, v = beta.requires_grad_(), v.requires_grad_()
    ours = read("delta", name, q, k, v, (beta,), nu, False, "l2")
    phi = PLAIN[name]
    ref = fast_weight_attend(PHI_NORMS["l2"](phi(q, nu, True)), PHI_NORMS["l2"](phi(k, nu, False)), v, beta)
    if not short_order(Tq, T, width(name, d, nu), M):
        assert ours is None  # the memory's order is the cheaper: the rule runs it
        return
    assert_read_matches(ours, ref, (q, k, v, beta), dict(rtol=1e-10, atol=1e-12), dict(rtol=1e-8, atol=1e-10))


def test_non_causal_delta_gradcheck():
    q, k, v = inputs(1, 2, 3, 5, 3, 8, seed=12)
    beta = torch.rand(1, 2, 5, dtype=torch.float64, requires_grad=True)
    delta = lambda *x: read("delta", "hedgehog", *x[:3], (x[3],), 0, False, "l2")  # noqa: E731
    assert torch.autograd.gradcheck(delta, (q, k, v, beta))
