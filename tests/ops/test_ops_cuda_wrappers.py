"""The autograd wiring of cuda_functions.py (cuda_causal, KernelFunction), checked on CPU against a stand-in for
fw_fairseq._cuda.

The real kernels need a GPU; this fake honours the same Python contract (autograd-free forward and
backward, in-place single steps) with the naive reference, so argument order, gradient routing and
the step path are tested everywhere.
"""
import torch

from fw_fairseq.ops.kernels.cuda_functions import cuda_causal
from fw_fairseq.ops.rules.delta.naive import naive_delta, naive_gated_delta
from fw_fairseq.ops.rules.sum.naive import naive_sum
from rule_runner import make_alpha


def _vjp(fn, inputs, grads):
    with torch.enable_grad():
        inputs = [x.detach().requires_grad_() for x in inputs]
        return torch.autograd.grad(fn(*inputs), inputs, grads)


class FakeExtension:
    @staticmethod
    def sum_forward(q, k, v, state):
        return naive_sum(q, k, v, state, True)

    @staticmethod
    def sum_backward(q, k, v, state0, do, dfinal):
        return _vjp(lambda *a: naive_sum(*a, True), (q, k, v, state0), (do, dfinal))

    @staticmethod
    def delta_forward(q, k, v, beta, state):
        return naive_delta(q, k, v, beta, state, True)

    @staticmethod
    def delta_backward(q, k, v, beta, state0, do, dfinal):
        return _vjp(lambda *a: naive_delta(*a, True), (q, k, v, beta, state0), (do, dfinal))

    @staticmethod
    def sum_step(q, k, v, state):
        o, new = naive_sum(q, k, v, state, True)
        state.copy_(new)
        return o

    @staticmethod
    def delta_step(q, k, v, beta, state):
        o, new = naive_delta(q, k, v, beta, state, True)
        state.copy_(new)
        return o

    @staticmethod
    def gated_delta_forward(q, k, v, beta, alpha, state):
        return naive_gated_delta(q, k, v, beta, alpha, state, True)

    @staticmethod
    def gated_delta_backward(q, k, v, beta, alpha, state0, do, dfinal):
        return _vjp(lambda *a: naive_gated_delta(*a, True), (q, k, v, beta, alpha, state0), (do, dfinal))

    @staticmethod
    def gated_delta_step(q, k, v, beta, alpha, state):
        o, new = naive_gated_delta(q, k, v, beta, alpha, state, True)
        state.copy_(new)
        return o


def test_wrappers_route_values_and_gradients(make_inputs):
    inputs = make_inputs(B=1, H=2, T=6, E=4, M=3, requires_grad=True)
    q, k, v, beta, state = inputs
    alpha = make_alpha(B=1, H=2, T=6, requires_grad=True)
    for wrapped, ref, args in [
        (lambda *a: cuda_causal(FakeExtension, "sum", *a), lambda *a: naive_sum(*a, True), (q, k, v, state)),
        (lambda *a: cuda_causal(FakeExtension, "delta", *a), lambda *a: naive_delta(*a, True), (q, k, v, beta, state)),
        (lambda *a: cuda_causal(FakeExtension, "gated_delta", *a), lambda *a: naive_gated_delta(*a, True),
         (q, k, v, beta, alpha, state)),
    ]:
        o, s = wrapped(*args)
        o_ref, s_ref = ref(*args)
        torch.testing.assert_close((o, s), (o_ref, s_ref))
        upstream = (torch.randn_like(o), torch.randn_like(s))
        torch.testing.assert_close(torch.autograd.grad((o, s), args, upstream),
                                   torch.autograd.grad((o_ref, s_ref), args, upstream))
        (grad_q,) = torch.autograd.grad(wrapped(*args)[0], q, upstream[0])  # final state unused
        torch.testing.assert_close(grad_q, torch.autograd.grad(ref(*args)[0], q, upstream[0])[0])


def test_single_step_without_grad_leaves_the_callers_state_alone(make_inputs):
    q, k, v, beta, state = make_inputs(B=2, H=2, T=1, E=4, M=3)
    alpha = make_alpha(B=2, H=2, T=1)
    before = state.clone()
    with torch.no_grad():
        o, s = cuda_causal(FakeExtension, "delta", q, k, v, beta, state)
        o_sum, s_sum = cuda_causal(FakeExtension, "sum", q, k, v, state)
        o_gated, s_gated = cuda_causal(FakeExtension, "gated_delta", q, k, v, beta, alpha, state)
    torch.testing.assert_close((o, s), naive_delta(q, k, v, beta, before, True))
    torch.testing.assert_close((o_sum, s_sum), naive_sum(q, k, v, before, True))
    torch.testing.assert_close((o_gated, s_gated), naive_gated_delta(q, k, v, beta, alpha, before, True))
    torch.testing.assert_close(state, before)
