"""The hand-written backward passes of the chunked forms (ChunkedSum, ChunkedDelta) against the naive
loop's autograd in float64, for every combination of upstream gradients they special-case."""
import pytest
import torch

from fw_fairseq.ops.rules.delta.chunked import chunked_delta, chunked_gated_delta

from fw_fairseq.ops.rules.sum.chunked import chunked_sum
from fw_fairseq.ops.rules.delta.chunked_function import unit_lower_inverse_
from fw_fairseq.ops.rules.delta.naive import naive_delta, naive_gated_delta
from rule_runner import SCALARS, make_alpha, run_rule


@pytest.mark.parametrize("C", [1, 5, 16, 17, 33, 64])
def test_unit_lower_inverse_matches_dense_inverse(C):
    g = torch.Generator().manual_seed(C)
    L = torch.randn(3, 2, C, C, generator=g, dtype=torch.float64).tril(-1) / C
    expected = torch.linalg.inv(L + torch.eye(C, dtype=torch.float64))
    torch.testing.assert_close(unit_lower_inverse_(L.clone()), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("upstream", ["output", "state"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("T,chunk", [(29, 8), (29, 64), (40, 20)])  # several chunks, one chunk, block inverse
def test_backward_with_partial_upstream(make_inputs, rule, upstream, with_state, T, chunk):
    q, k, v, beta, state = make_inputs(T=T, requires_grad=True)
    alpha = make_alpha(T=T, requires_grad=True)
    state = state if with_state else None
    scalars = [{"beta": beta, "alpha": alpha}[name] for name in SCALARS[rule]]
    wrt = [x for x in (q, k, v, *scalars, state) if x is not None]

    def grads(impl):
        o, s = run_rule(rule, impl, q, k, v, beta, state, chunk, alpha=alpha)
        out = o if upstream == "output" else s
        g = torch.Generator().manual_seed(3)
        return torch.autograd.grad(out, wrt, torch.randn(out.shape, generator=g, dtype=out.dtype), allow_unused=True)

    for got, ref in zip(grads("chunked"), grads("naive")):
        if ref is None or got is None:  # e.g. no state upstream: q gets no gradient
            assert (got is None or not got.any()) and (ref is None or not ref.any())
        else:
            torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("T,chunk", [(23, 4), (23, 64)])
def test_delta_write_only_grads_match_naive(make_inputs, T, chunk, gated):
    _, k, v, beta, _ = make_inputs(T=T, requires_grad=True)
    alpha = make_alpha(T=T, requires_grad=True) if gated else None
    _, S = chunked_gated_delta(None, k, v, beta, alpha, None, True, chunk_size=chunk)
    if gated:
        _, S_ref = naive_gated_delta(k, k, v, beta, alpha, None, True)
    else:
        _, S_ref = naive_delta(k, k, v, beta, None, True)
    torch.testing.assert_close(S, S_ref, rtol=1e-10, atol=1e-10)
    upstream = torch.randn(S.shape, generator=torch.Generator().manual_seed(5), dtype=S.dtype)
    wrt = (k, v, beta, alpha) if gated else (k, v, beta)
    got = torch.autograd.grad(S, wrt, upstream)
    # the naive loops read with q = k: their q-gradient path is unused since only the state is differentiated
    ref = torch.autograd.grad(S_ref, wrt, upstream)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_gradcheck_several_chunks_and_block_inverse(make_inputs, rule):
    q, k, v, beta, state = make_inputs(B=1, H=1, T=40, E=4, M=3, requires_grad=True)
    alpha = make_alpha(B=1, H=1, T=40, requires_grad=True)
    if rule == "sum":
        assert torch.autograd.gradcheck(lambda q, k, v, s: chunked_sum(q, k, v, s, True, chunk_size=20), (q, k, v, state))
    elif rule == "delta":
        fn = lambda q, k, v, b, s: chunked_delta(q, k, v, b, s, True, chunk_size=20)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v, beta, state))
    else:
        fn = lambda q, k, v, b, a, s: chunked_gated_delta(q, k, v, b, a, s, True, chunk_size=20)  # noqa: E731
        assert torch.autograd.gradcheck(fn, (q, k, v, beta, alpha, state))


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_forward_without_autograd_matches_recorded_forward(make_inputs, rule):
    # the Functions skip stacking their saved tensors when no backward can follow
    inputs = make_inputs(T=29, requires_grad=True)
    recorded = run_rule(rule, "chunked", *inputs, chunk=8)
    with torch.no_grad():
        plain = run_rule(rule, "chunked", *inputs, chunk=8)
    assert recorded[0].grad_fn is not None and plain[0].grad_fn is None
    for a, b in zip(plain, recorded):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_double_backward_is_refused(make_inputs, rule):
    # A gradient penalty next to another term: torch's once_differentiable let this through with a
    # graph-less first-order gradient, silently dropping the penalty's second-order part.
    # tests/cuda/test_kernels.py checks the CUDA Functions refuse it alike.
    q, k, v, beta, state = make_inputs(T=20, requires_grad=True)
    o, _ = run_rule(rule, "chunked", q, k, v, beta, state, chunk=8)
    with pytest.raises(RuntimeError, match="double backward"):
        (g,) = torch.autograd.grad(o.sum(), q, create_graph=True)
        torch.autograd.grad(g.square().sum() + q.square().sum(), q)
