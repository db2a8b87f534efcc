"""fast_weight_attend: the non-causal read of all writes, in whichever order is cheaper, is the same
function as naive_noncausal for outputs and gradients (float64), on both sides of the cost switch."""
import pytest
import torch

from fw_fairseq.ops import fast_weight_attend
from rule_runner import assert_read_matches, noncausal_reference as naive_noncausal


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("T,Tq,E,M", [(5, 3, 16, 9),     # short: (q k^T) v
                                      (80, 70, 4, 3),    # long, narrow: q (k^T v)
                                      (1, 1, 8, 5)])
def test_attend_matches_naive_noncausal_outputs_and_grads(make_inputs, delta, T, Tq, E, M):
    _, k, v, beta, _ = make_inputs(T=T, E=E, M=M, requires_grad=True)
    q = make_inputs(T=Tq, E=E, M=M, seed=5, requires_grad=True)[0]
    b = beta if delta else None
    ours, ref = fast_weight_attend(q, k, v, b), naive_noncausal(q, k, v, b)
    assert_read_matches(ours, ref, [q, k, v] + ([beta] if delta else []), dict(rtol=1e-10, atol=1e-12),
                        dict(rtol=1e-9, atol=1e-11))


def test_attend_gradcheck(make_inputs):
    _, k, v, _, _ = make_inputs(B=1, H=1, T=4, E=6, M=3, requires_grad=True)
    q = make_inputs(B=1, H=1, T=3, E=6, M=3, seed=2, requires_grad=True)[0]
    assert torch.autograd.gradcheck(fast_weight_attend, (q, k, v))


def test_attend_rejects_mismatched_query(make_inputs):
    _, k, v, _, _ = make_inputs(E=8)
    q = make_inputs(E=6, M=5, seed=1)[0]
    with pytest.raises(ValueError, match="fast_weight_attend: q has shape"):
        fast_weight_attend(q, k, v)


@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
@pytest.mark.parametrize("T,Tq,E,M", [(5, 3, 16, 9), (80, 70, 4, 3)])
def test_attend_without_autograd_reads_the_effective_writes(make_inputs, rule, T, Tq, E, M):
    """Where autograd records nothing, the delta rules' short order (q k^T) U (rules/delta/writes.py) and
    their long one give naive_noncausal's outputs, padded positions (beta = 0, zero values) included."""
    from rule_runner import make_alpha

    _, k, v, beta, _ = make_inputs(T=T, E=E, M=M)
    q = make_inputs(T=Tq, E=E, M=M, seed=5)[0]
    beta, v = beta.clone(), v.clone()
    beta[0, :, -1], v[0, :, -1] = 0.0, 0.0  # a padded last position of sentence 0
    alpha = make_alpha(B=2, H=3, T=T) if rule == "gated_delta" else None
    with torch.no_grad():
        ours = fast_weight_attend(q, k, v, beta, alpha)
    torch.testing.assert_close(ours, naive_noncausal(q, k, v, beta, alpha), rtol=1e-10, atol=1e-12)


def test_the_short_order_has_its_own_backward_with_contiguous_gradients(make_inputs):
    """The sum rule's (q k^T) v with autograd is ScoresRead (attend_function.py): its gradients come out
    contiguous, where autograd's of k^T was a transposed view the feature map's backward had to copy."""
    _, k, v, _, _ = make_inputs(T=5, E=16, M=9, requires_grad=True)
    q = make_inputs(T=3, E=16, M=9, seed=5, requires_grad=True)[0]
    o = fast_weight_attend(q, k, v)
    assert type(o.grad_fn).__name__ == "ScoresReadBackward"
    grads = torch.autograd.grad(o, (q, k, v), torch.randn_like(o))
    assert all(g.is_contiguous() for g in grads)
