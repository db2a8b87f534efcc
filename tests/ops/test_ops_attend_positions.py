"""A read whose kernel carries the positions (UpdateRule.attend's `positions`, ops/common/positions.py) is the read
of the wider features phi (x) g: the same function as naive_noncausal over them, outputs and gradients (float64),
in both orders and for every rule."""
import pytest
import torch

from fw_fairseq.ops.common.positions import with_positions
from fw_fairseq.ops.common.read_order import short_order
from fw_fairseq.ops.rules.registry import RULES
from rule_runner import assert_read_matches, make_alpha, noncausal_reference


def unit_factors(B, T, R, seed):
    """Positional factors [B, T, R] of norm 1: the wide keys keep the keys' norm, and the delta rule stays
    contractive."""
    g = torch.randn(B, T, R, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return g / g.norm(dim=-1, keepdim=True)


def read_both_ways(make_inputs, rule, T, Tq, E, M, R, requires_grad):
    _, k, v, beta, _ = make_inputs(T=T, E=E, M=M, requires_grad=requires_grad)
    q = make_inputs(T=Tq, E=E, M=M, seed=5, requires_grad=requires_grad)[0]
    g, h = unit_factors(2, Tq, R, 1), unit_factors(2, T, R, 2)
    scalars = {"sum": (), "delta": (beta,), "gated_delta": (beta, make_alpha(B=2, H=3, T=T))}[rule]
    ours = RULES[rule].attend(q, k, v, *scalars, positions=(g, h))
    reference = noncausal_reference(with_positions(q, g), with_positions(k, h), v, *scalars)
    return ours, reference, [q, k, v, *scalars[:1]]


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("T,Tq,E,M,R", [(6, 4, 8, 5, 3),     # short: the scores weighed
                                        (60, 50, 4, 3, 3)])  # long: the memory of the wide features
def test_positions_match_the_wide_features_outputs_and_grads(make_inputs, rule, T, Tq, E, M, R):
    """With autograd the sum rule weighs its scores where the order is short; the delta rules (and every rule on
    a long read) write the memory of the wide features."""
    ours, reference, inputs = read_both_ways(make_inputs, rule, T, Tq, E, M, R, requires_grad=True)
    assert_read_matches(ours, reference, inputs, dict(rtol=1e-10, atol=1e-12), dict(rtol=1e-9, atol=1e-11))


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_positions_without_autograd_weigh_the_scores(make_inputs, rule):
    """Where autograd records nothing every rule takes the short order: the delta rules' writes over the wide keys,
    their read over the narrow ones, weighed."""
    assert short_order(4, 6, 8, 5, 3)
    with torch.no_grad():
        ours, reference, _ = read_both_ways(make_inputs, rule, 6, 4, 8, 5, 3, requires_grad=False)
    torch.testing.assert_close(ours, reference, rtol=1e-10, atol=1e-12)


def test_the_weighted_short_order_has_its_own_backward(make_inputs):
    ours, _, inputs = read_both_ways(make_inputs, "sum", 6, 4, 8, 5, 3, requires_grad=True)
    assert type(ours.grad_fn).__name__ == "ScoresReadBackward"
    assert all(g.is_contiguous() for g in torch.autograd.grad(ours, inputs, torch.randn_like(ours)))


def test_positions_take_the_order_of_their_cost():
    """The short order weighs T Tq scores; the memory is R times wider: a long read of many factors stays short."""
    assert not short_order(60, 60, 32, 16)
    assert short_order(60, 60, 32, 16, R=9)
