"""The lazy decoding state (fw_fairseq/modules/decoder_state.py) is the same function as naive.py:
steps from the cached writes give the naive loop's outputs (and gradients), and folding the cache
gives its state, so decoding can continue with the fixed-size step (float64)."""
import pytest
import torch

from fw_fairseq.modules.decoder_state import fits, fold, lazy_step
from fw_fairseq.ops import append_z_column
from fw_fairseq.ops.naive import naive_delta, naive_gated_delta, naive_sum
from fw_fairseq.ops.step import step_gated_delta, step_sum
from rule_runner import make_alpha


def lazy_run(q, k, v, beta=None, alpha=None):
    """Every position through lazy_step: (o [B, H, T, M], writes, decay)."""
    outputs, phi_keys, writes, decay = [], None, None, None
    for t in range(q.shape[2]):
        scalars = [None if x is None else x[:, :, t: t + 1] for x in (beta, alpha)]
        row = [x[:, :, t: t + 1] for x in (q, k, v)]  # [B, H, 1, E | M]
        o, phi_keys, writes, decay = lazy_step(*row, phi_keys, writes, decay, *scalars)
        outputs.append(o)
    torch.testing.assert_close(phi_keys, k, rtol=0, atol=0)
    return torch.cat(outputs, dim=2), writes, decay


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
def test_lazy_steps_and_fold_match_naive(make_inputs, rule):
    q, k, v, beta, _ = make_inputs(B=2, H=3, T=9, E=6, M=5, requires_grad=True)
    alpha = make_alpha(B=2, H=3, T=9, requires_grad=True)
    if rule == "sum":
        args, naive_args = (v,), (v,)
    elif rule == "delta":
        args, naive_args = (v, beta), (v, beta)
    else:
        args, naive_args = (v, beta, alpha), (v, beta, alpha)
    naive = {"sum": naive_sum, "delta": naive_delta, "gated_delta": naive_gated_delta}[rule]
    o_ref, s_ref = naive(q, k, *naive_args, output_final_state=True)
    o, writes, decay = lazy_run(q, k, *args)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(fold(k, writes, decay), s_ref, rtol=1e-12, atol=1e-12)
    assert (decay is None) == (rule != "gated_delta")
    upstream = torch.randn_like(o_ref)
    wrt = [q, k, *args]
    for a, b in zip(torch.autograd.grad(o, wrt, upstream), torch.autograd.grad(o_ref, wrt, upstream),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("rule", ["sum", "gated_delta"])
def test_folded_state_continues_with_the_fixed_size_step(make_inputs, rule):
    """Lazy for 5 positions, fold, then step.py for the rest: the naive loop's outputs."""
    q, k, v, beta, _ = make_inputs(B=2, H=2, T=8, E=6, M=4)
    alpha = make_alpha(B=2, H=2, T=8)
    if rule == "sum":
        v = append_z_column(v)
        beta = alpha = None
        o_ref, _ = naive_sum(q, k, v)
    else:
        o_ref, _ = naive_gated_delta(q, k, v, beta, alpha)
    head = [None if x is None else x[:, :, :5] for x in (beta, alpha)]
    o_head, writes, decay = lazy_run(q[:, :, :5], k[:, :, :5], v[:, :, :5], *head)
    state, tail = fold(k[:, :, :5], writes, decay), []
    for t in range(5, 8):
        row = [x[:, :, t: t + 1] for x in (q, k, v)]
        if rule == "sum":
            o, state = step_sum(*row, initial_state=state, output_final_state=True)
        else:
            o, state = step_gated_delta(*row, beta[:, :, t: t + 1], alpha[:, :, t: t + 1],
                                        initial_state=state, output_final_state=True)
        tail.append(o)
    torch.testing.assert_close(torch.cat([o_head, *tail], dim=2), o_ref, rtol=1e-12, atol=1e-12)


def test_fits_compares_the_values_read_with_the_state():
    # DPFP-2 (E = 256), delta rule (M = 64): 51 * 320 = 16320 <= 256 * 64 = 16384 < 52 * 320
    assert fits(51, 256, 64) and not fits(52, 256, 64)
    # ELU sum (E = 64, M = 65): 32 * 129 = 4128 <= 4160 < 33 * 129
    assert fits(32, 64, 65) and not fits(33, 64, 65)
