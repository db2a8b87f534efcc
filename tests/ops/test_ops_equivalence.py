"""Fast paths == the naive reference (float64): outputs, final states and gradients."""
import pytest
import torch

from fw_fairseq.ops import fast_weight_delta, fast_weight_sum
from fw_fairseq.ops.rules.delta.naive import naive_delta
from fw_fairseq.ops.rules.sum.naive import naive_sum, quadratic_sum
from rule_runner import SCALARS, make_alpha, run_rule

# (B, H, T, E, M, chunk): T not a multiple of the chunk, T = 1, T a multiple, T < chunk, chunk 1
SHAPES = [(2, 3, 37, 8, 5, 8), (1, 2, 1, 4, 4, 64), (2, 1, 64, 6, 3, 16), (1, 1, 20, 9, 4, 64), (1, 2, 7, 4, 6, 1)]


def _grads(rule, impl, inputs, alpha, upstream, chunk=64):
    """Gradients w.r.t. q, k, v, (beta, alpha), initial_state under random upstream gradients on (o, state)."""
    o, state = run_rule(rule, impl, *inputs, chunk=chunk, alpha=alpha)
    q, k, v, beta, state0 = inputs
    wrt = [q, k, v] + [{"beta": beta, "alpha": alpha}[name] for name in SCALARS[rule]] + [state0]
    return torch.autograd.grad((o, state), wrt, grad_outputs=upstream)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "B{}H{}T{}E{}M{}C{}".format(*s))
@pytest.mark.parametrize("impl", ["chunked", "public"])
def test_matches_naive_outputs_states_and_grads(make_inputs, rule, shape, impl):
    B, H, T, E, M, chunk = shape
    inputs = make_inputs(B, H, T, E, M, requires_grad=True)
    alpha = make_alpha(B, H, T, requires_grad=True)
    o_ref, s_ref = run_rule(rule, "naive", *inputs, alpha=alpha)
    o, s = run_rule(rule, impl, *inputs, chunk=chunk, alpha=alpha)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)

    g = torch.Generator().manual_seed(1)
    upstream = (torch.randn(o.shape, generator=g, dtype=o.dtype), torch.randn(s.shape, generator=g, dtype=s.dtype))
    ref = _grads(rule, "naive", inputs, alpha, upstream)
    got = _grads(rule, impl, inputs, alpha, upstream, chunk=chunk)
    names = ["q", "k", "v", *SCALARS[rule], "state"]
    assert len(got) == len(names)
    for name, a, b in zip(names, got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m, n=name: f"grad {n}: {m}")


@pytest.mark.parametrize("T", [1, 37])
def test_sum_rule_matches_quadratic_oracle(make_inputs, T):
    q, k, v, _, state = make_inputs(T=T)
    oracle = quadratic_sum(q, k, v, state)
    torch.testing.assert_close(naive_sum(q, k, v, state)[0], oracle, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(fast_weight_sum(q, k, v, state)[0], oracle, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("split", [1, 13, 64, 99])
def test_split_and_resume_equals_one_call(make_inputs, rule, split):
    q, k, v, beta, state = make_inputs(T=100)
    o_full, s_full = run_rule(rule, "public", q, k, v, beta, state)
    first = [x[:, :, :split] for x in (q, k, v, beta)]
    second = [x[:, :, split:] for x in (q, k, v, beta)]
    o1, s1 = run_rule(rule, "public", *first, state)
    o2, s2 = run_rule(rule, "public", *second, s1)
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), o_full, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s2, s_full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_no_final_state_unless_asked_and_zero_initial_state(make_inputs, rule):
    q, k, v, beta, _ = make_inputs(T=9)
    fn = (lambda *a, **kw: fast_weight_sum(*a[:3], **kw)) if rule == "sum" else fast_weight_delta
    o, s = fn(q, k, v, beta)
    assert s is None
    zero = torch.zeros(q.shape[0], q.shape[1], q.shape[-1], v.shape[-1], dtype=q.dtype)
    torch.testing.assert_close(o, fn(q, k, v, beta, initial_state=zero)[0])


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 5e-2), (torch.float16, 5e-3)])
def test_low_precision_inputs_give_float32_results(make_inputs, rule, dtype, tol):
    ref_in = make_inputs(T=70)
    o_ref, s_ref = run_rule(rule, "naive", *ref_in)
    o, s = run_rule(rule, "public", *[x.to(dtype) for x in ref_in])
    assert o.dtype == s.dtype == torch.float32
    torch.testing.assert_close(o.double(), o_ref, rtol=tol, atol=tol)
    torch.testing.assert_close(s.double(), s_ref, rtol=tol, atol=tol)


def test_mixed_dtypes_promote(make_inputs):
    # FAVOR+ returns float32 features for fp16 activations, so q, k float32 with v fp16 must work
    q, k, v, beta, state = make_inputs(T=10)
    o, s = fast_weight_delta(q.float(), k.float(), v.half(), beta.half(), state.half(), True)
    assert o.dtype == torch.float32 and s.dtype == torch.float32
    torch.testing.assert_close(o.double(), naive_delta(q, k, v, beta, state)[0], rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_non_contiguous_inputs(make_inputs, rule):
    q, k, v, beta, state = make_inputs(T=21)
    # the same values seen through a time-first layout: [T, B, H, D] -> permuted views [B, H, T, D]
    views = [x.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3) for x in (q, k, v)]
    beta_view = beta.permute(2, 0, 1).contiguous().permute(1, 2, 0)
    assert not views[0].is_contiguous()
    o, s = run_rule(rule, "public", *views, beta_view, state.transpose(-1, -2).contiguous().transpose(-1, -2))
    o_ref, s_ref = run_rule(rule, "naive", q, k, v, beta, state)
    torch.testing.assert_close(o, o_ref, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s, s_ref, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_autograd_keeps_states_per_chunk_not_per_step(make_inputs, rule):
    B, H, T, E, M = 1, 1, 256, 64, 64  # per-step states would dwarf inputs, scores and chunk states
    inputs = make_inputs(B, H, T, E, M, requires_grad=True)
    storages = {}  # the same storage is often saved by several ops (views): count it once

    def pack(x):
        storages[x.untyped_storage().data_ptr()] = x.untyped_storage().nbytes() // x.element_size()
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        run_rule(rule, "public", *inputs, chunk=64)
    saved, per_step_states = sum(storages.values()), B * H * T * E * M
    assert saved < per_step_states / 4, f"saved {saved} elements, per-step states would be {per_step_states}"
