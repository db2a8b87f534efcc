"""The gated delta rule beyond what the shared rule tests check (tests/ops/test_ops_equivalence.py and
friends run it beside the sum and delta rules): alpha = 1 is the delta rule, strong decays stay exact
(the chunk form works with differences of log-gates), the non-causal write, gradcheck of the public op."""
import pytest
import torch

from fw_fairseq.ops import fast_weight_attend, fast_weight_delta, fast_weight_gated_delta, fast_weight_read
from fw_fairseq.ops import fast_weight_write
from fw_fairseq.ops.rules.delta.naive import naive_gated_delta
from rule_runner import noncausal_reference as naive_noncausal
from rule_runner import make_alpha


@pytest.mark.parametrize("T", [1, 29, 100])
def test_alpha_one_is_the_delta_rule(make_inputs, T):
    q, k, v, beta, state = make_inputs(T=T)
    ones = torch.ones_like(beta)
    for a, b in zip(fast_weight_gated_delta(q, k, v, beta, ones, state, True),
                    fast_weight_delta(q, k, v, beta, state, True), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fast_weight_write(k, v, beta, ones), fast_weight_write(k, v, beta),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("low", [1e-3, 0.05])
def test_strong_decay_matches_naive(make_inputs, low):
    # products of alphas over a chunk of 25 underflow far below 1e-30: no 1/gamma is formed anywhere
    q, k, v, beta, state = make_inputs(T=100, requires_grad=True)
    alpha = make_alpha(T=100, low=low, requires_grad=True)
    got = fast_weight_gated_delta(q, k, v, beta, alpha, state, True)
    ref = naive_gated_delta(q, k, v, beta, alpha, state, True)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    upstream = [torch.randn_like(x) for x in ref]
    wrt = (q, k, v, beta, alpha, state)
    for a, b in zip(torch.autograd.grad(got, wrt, upstream), torch.autograd.grad(ref, wrt, upstream), strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("T", [1, 5])
def test_gradcheck_public(make_inputs, T):
    q, k, v, beta, state = make_inputs(B=1, H=2, T=T, E=3, M=5, requires_grad=True)
    alpha = make_alpha(B=1, H=2, T=T, requires_grad=True)
    fn = lambda q, k, v, b, a, s: fast_weight_gated_delta(q, k, v, b, a, s, True)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, beta, alpha, state))


def test_gradcheck_write_read(make_inputs):
    q, k, v, beta, _ = make_inputs(B=1, H=2, T=5, E=3, M=5, requires_grad=True)
    alpha = make_alpha(B=1, H=2, T=5, requires_grad=True)
    q = q[:, :, :3].detach().requires_grad_()
    fn = lambda q, k, v, b, a: fast_weight_read(q, fast_weight_write(k, v, b, a))  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v, beta, alpha))


@pytest.mark.parametrize("T", [29, 70])
def test_write_and_attend_match_naive_noncausal(make_inputs, T):
    q, k, v, beta, _ = make_inputs(T=T)
    alpha = make_alpha(T=T)
    ref = naive_noncausal(q, k, v, beta, alpha)
    torch.testing.assert_close(fast_weight_read(q, fast_weight_write(k, v, beta, alpha)), ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast_weight_attend(q, k, v, beta, alpha), ref, rtol=1e-10, atol=1e-10)
    # the write is the causal rule's final state
    torch.testing.assert_close(fast_weight_write(k, v, beta, alpha),
                               fast_weight_gated_delta(q, k, v, beta, alpha, None, True)[1], rtol=1e-12, atol=1e-12)
