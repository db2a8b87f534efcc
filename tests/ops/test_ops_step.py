"""The decoding-step path (T = 1, no chunk machinery: rules/<rule>/step.py) is the same function as the reference."""
import pytest
import torch

from fw_fairseq.ops import RULES
from rule_runner import SCALARS, make_alpha, run_rule


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_step_matches_naive_outputs_states_and_grads(make_inputs, rule, with_state, dtype):
    q, k, v, beta, state = make_inputs(B=2, H=3, T=1, E=6, M=5, requires_grad=True)
    alpha = make_alpha(B=2, H=3, T=1, requires_grad=True)
    state = state if with_state else None
    low = [None if x is None else x.to(dtype) for x in (q, k, v, beta, state, alpha)]
    o, s = run_rule(rule, "public", *low[:5], alpha=low[5])
    assert o.dtype == s.dtype == (torch.float32 if dtype == torch.bfloat16 else dtype)
    if dtype != torch.float64:
        return
    o_ref, s_ref = run_rule(rule, "naive", q, k, v, beta, state, alpha=alpha)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)
    scalars = [{"beta": beta, "alpha": alpha}[name] for name in SCALARS[rule]]
    wrt = [q, k, v, *scalars] + ([state] if with_state else [])
    upstream = (torch.randn_like(o_ref), torch.randn_like(s_ref))
    # with no initial state alpha decays nothing: the step leaves it out of its graph, a zero gradient
    for a, b in zip(torch.autograd.grad((o, s), wrt, upstream, allow_unused=True, materialize_grads=True),
                    torch.autograd.grad((o_ref, s_ref), wrt, upstream), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_in_place_step_matches_the_step(make_inputs, rule, with_state, dtype, cpu_form):
    """The record's in_place_step (generation) gives the step's output and leaves the step's state in its argument."""
    q, k, v, beta, state = make_inputs(B=2, H=3, T=1, E=6, M=5)
    alpha = make_alpha(B=2, H=3, T=1)
    state = state if with_state else torch.zeros_like(state)
    o_ref, s_ref = run_rule(rule, "naive", q, k, v, beta, state, alpha=alpha)
    scalars = {"sum": (), "delta": (beta,), "gated_delta": (beta, alpha)}[rule]
    updated = state.to(dtype)  # a copy; q, k, v and the scalars are cast to the state's dtype
    o = RULES[rule].in_place_step(q, k, v, *scalars, updated)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(o, o_ref.to(dtype), rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(updated, s_ref.to(dtype), rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_in_place_step_continues_reordered_rows_into_out(make_inputs, rule, cpu_form):
    """Beam search's reorder folded into the step: the hypotheses continue rows `order` of the state
    (repeated and dropped rows), their new states go to `out`, the old state is left as it was."""
    q, k, v, beta, _ = make_inputs(B=3, H=2, T=1, E=6, M=5)
    alpha = make_alpha(B=3, H=2, T=1)
    state = torch.randn(4, 2, 6, 5, dtype=torch.float64)  # B' = 4 rows before the reorder
    order = torch.tensor([3, 0, 3])
    o_ref, s_ref = run_rule(rule, "naive", q, k, v, beta, state[order], alpha=alpha)
    scalars = {"sum": (), "delta": (beta,), "gated_delta": (beta, alpha)}[rule]
    before, out = state.clone(), torch.full((3, 2, 6, 5), float("nan"), dtype=torch.float64)
    o = RULES[rule].in_place_step(q, k, v, *scalars, state, order=order, out=out)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, s_ref, rtol=1e-12, atol=1e-12)
    assert torch.equal(state, before)


def test_no_kernel_while_torch_compile_traces(monkeypatch):
    """The CPU kernels are pybind functions, which torch.compile cannot trace: while it traces, every op
    with a kernel (the state and lazy decoding steps, DPFP) takes its PyTorch form."""
    from fw_fairseq.ops.kernels import cpu_extension

    x = torch.zeros(1)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert cpu_extension.cpu_kernel(x) is None
