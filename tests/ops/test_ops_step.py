"""The decoding-step path (T = 1, no chunk machinery) is the same function as the reference."""
import pytest
import torch

from fw_fairseq.ops import fast_weight_delta, fast_weight_sum
from fw_fairseq.ops.naive import naive_delta, naive_sum


@pytest.mark.parametrize("rule", ["sum", "delta"])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_step_matches_naive_outputs_states_and_grads(make_inputs, rule, with_state, dtype):
    q, k, v, beta, state = make_inputs(B=2, H=3, T=1, E=6, M=5, requires_grad=True)
    state = state if with_state else None
    args = (q, k, v) if rule == "sum" else (q, k, v, beta)
    ours_fn, ref_fn = (fast_weight_sum, naive_sum) if rule == "sum" else (fast_weight_delta, naive_delta)
    low = [x.to(dtype) for x in args]
    o, s = ours_fn(*low, None if state is None else state.to(dtype), True)
    assert o.dtype == s.dtype == (torch.float32 if dtype == torch.bfloat16 else dtype)
    if dtype != torch.float64:
        return
    o_ref, s_ref = ref_fn(*args, state, True)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(s, s_ref, rtol=1e-12, atol=1e-12)
    wrt = list(args) + ([state] if with_state else [])
    upstream = (torch.randn_like(o_ref), torch.randn_like(s_ref))
    for a, b in zip(torch.autograd.grad((o, s), wrt, upstream),
                    torch.autograd.grad((o_ref, s_ref), wrt, upstream)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
