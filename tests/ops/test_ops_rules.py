"""The rule table (fw_fairseq/ops/rules/record.py): what each record promises its readers (the attention
module, the synthetic task, the dispatch) holds for the ops it names."""
import pytest
import torch

from fw_fairseq.ops import RULES, append_z_column, divide_by_z
from fw_fairseq.ops.common.z_column import Z_EPS
from rule_runner import make_alpha


def _scalars(rule, beta, alpha):
    return [{"beta": beta, "alpha": alpha}[name] for name in rule.scalars]


@pytest.mark.parametrize("name", list(RULES))
@pytest.mark.parametrize("T", [1, 40])
def test_causal_step_chunked_and_write_agree(make_inputs, name, T):
    rule = RULES[name]
    q, k, v, beta, state = make_inputs(T=T)
    scalars = _scalars(rule, beta, make_alpha(T=T))
    o, final = rule.causal(q, k, v, *scalars, state, True)
    off_kernel = rule.step if T == 1 else rule.chunked
    for a, b in zip(off_kernel(q, k, v, *scalars, state, True), (o, final), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # the write is the causal rule's final state from a zero state
    torch.testing.assert_close(rule.write(k, v, *scalars), rule.causal(q, k, v, *scalars, None, True)[1],
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(RULES))
def test_padded_positions_write_and_decay_nothing(make_inputs, name):
    # A padded position has a zero key (the caller zeroes phi(k)) and each scalar at its pad value: the
    # rule must then leave the state and every other output as if the position were not there.
    rule = RULES[name]
    q, k, v, beta, state = make_inputs(T=30)
    scalars = dict(zip(("beta", "alpha"), (beta, make_alpha(T=30, low=0.1))))
    pads = torch.zeros(30, dtype=torch.bool)
    pads[[0, 7, 8, 29]] = True
    k = k.masked_fill(pads[:, None], 0.0)
    for name_, value in rule.pad_values.items():
        scalars[name_] = scalars[name_].masked_fill(pads, value)
    padded = rule.causal(q, k, v, *(scalars[n] for n in rule.scalars), state, True)
    keep = ~pads
    alone = rule.causal(q[:, :, keep], k[:, :, keep], v[:, :, keep], *(scalars[n][:, :, keep] for n in rule.scalars),
                        state, True)
    torch.testing.assert_close(padded[0][:, :, keep], alone[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(padded[1], alone[1], rtol=1e-12, atol=1e-12)
    assert set(rule.pad_values) == set(rule.scalars)


def test_z_column_normalises_the_sum_rule(make_inputs):
    q, k, v, _, _ = make_inputs(T=25)
    rule = RULES["sum"]
    assert rule.z_column and not rule.normalised_phi
    y = divide_by_z(rule.causal(q, k, append_z_column(v))[0])  # [B, H, T, M]
    scores = (q @ k.transpose(-1, -2)).tril()  # [B, H, T, T], s <= t
    expected = (scores @ v) / (scores.sum(-1, keepdim=True) + Z_EPS)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


def test_divide_by_z_has_its_own_backward_equal_to_autograds():
    """divide_by_z's hand-written backward (z_column.py) = autograd of the plain slice-and-divide (float64),
    for a strided read and a strided upstream gradient."""
    from fw_fairseq.ops import divide_by_z

    g = torch.Generator().manual_seed(3)
    o = (torch.rand(2, 3, 6, 5, generator=g, dtype=torch.float64) + 0.1).transpose(1, 2).requires_grad_()
    upstream = torch.randn(2, 6, 4, 3, generator=g, dtype=torch.float64).transpose(-1, -2)  # [2, 6, 3, 4]
    y = divide_by_z(o)
    assert type(y.grad_fn).__name__ == "DivideByZBackward"
    expected = o[..., :-1] / (o[..., -1:] + Z_EPS)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    torch.testing.assert_close(torch.autograd.grad(y, o, upstream)[0], torch.autograd.grad(expected, o, upstream)[0],
                               rtol=1e-13, atol=1e-13)
    assert torch.autograd.gradcheck(divide_by_z, (o.detach()[:1, :2].clone().requires_grad_(),))
