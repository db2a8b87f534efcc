"""torch.compile(fullgraph=True) of every public op, forward and backward, on the chunked branch and on
the CUDA branch (the kernels stood in for by test_ops_cuda_wrappers' FakeExtension, on the CPU):
no graph break (fullgraph raises on one), and outputs and gradients equal to eager in float64. Eager
calls keep running the autograd Functions themselves, and a bad argument is still refused with the
op's own one-line message while torch.compile traces."""
import pytest
import torch
import torch._dynamo.testing

from fw_fairseq.ops.kernels import cuda_extension
from fw_fairseq.ops import fast_weight_delta, fast_weight_sum
from public_ops import OP_IDS, PUBLIC_OPS
from rule_runner import run_rule
from fw_fairseq.ops.rules.delta.naive import naive_delta, naive_gated_delta
from fw_fairseq.ops.rules.sum.naive import naive_sum
from test_ops_cuda_wrappers import FakeExtension

# compiling costs about a second per case: one case per op and branch of the dispatch
COMPILED_OPS = ["sum-chunks-state", "sum-step-state", "delta-chunks-state", "delta-one-chunk", "gated-chunks-state",
                "gated-step", "write-gated", "read", "attend-scores", "attend-delta"]


def _vjp(fn, inputs, grads):
    return torch.func.vjp(lambda *a: fn(*a, True), *inputs)[1](grads)


class KernelStandIn(FakeExtension):
    """FakeExtension with its backward through torch.func: the kernel ops run below autograd, where
    FakeExtension's torch.autograd.grad records nothing (the real kernels need neither)."""

    @staticmethod
    def sum_backward(q, k, v, state0, do, dfinal):
        return _vjp(naive_sum, (q, k, v, state0), (do, dfinal))

    @staticmethod
    def delta_backward(q, k, v, beta, state0, do, dfinal):
        return _vjp(naive_delta, (q, k, v, beta, state0), (do, dfinal))

    @staticmethod
    def gated_delta_backward(q, k, v, beta, alpha, state0, do, dfinal):
        return _vjp(naive_gated_delta, (q, k, v, beta, alpha, state0), (do, dfinal))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _results_and_grads(call, inputs):
    """The op's results and the gradients of its inputs under fixed random upstream gradients."""
    results = call(*inputs)
    g = torch.Generator().manual_seed(7)
    upstream = [torch.randn(r.shape, generator=g, dtype=torch.float64) for r in results]
    grads = torch.autograd.grad(results, inputs, upstream, allow_unused=True, materialize_grads=True)
    return [r.detach() for r in results] + list(grads)


def _assert_compiled_equals_eager(call, inputs):
    # aot_eager: inductor compiles the same graphs (fast_weight_delta forward and backward: equal to eager),
    # but takes 10 to 40 s a case on 2 CPU cores, with its C++ build cache warm or cold
    compiled = torch.compile(call, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(_results_and_grads(compiled, inputs), _results_and_grads(call, inputs),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name,T,call", [case for case in PUBLIC_OPS if case[0] in COMPILED_OPS],
                         ids=[name for name in OP_IDS if name in COMPILED_OPS])
def test_compiled_op_equals_eager(make_inputs, name, T, call):
    _assert_compiled_equals_eager(call, make_inputs(B=2, H=2, T=T, E=6, M=5, requires_grad=True))


@pytest.mark.parametrize("rule", ["sum", "delta", "gated_delta"])
@pytest.mark.parametrize("T", [1, 5])
def test_compiled_cuda_branch_equals_eager(make_inputs, monkeypatch, rule, T):
    # the kernel ops run the CUDA wrappers (the step kernel at T = 1) and their Functions' backward
    monkeypatch.setattr(cuda_extension, "cuda_kernel", lambda q, v, kernel: KernelStandIn)

    def call(q, k, v, beta, state):
        o, final_state = run_rule(rule, "public", q, k, v, beta, state)
        return (o, final_state) if T == 1 else (o,)  # T = 5: the final state's gradient is zero

    _assert_compiled_equals_eager(call, make_inputs(B=2, H=2, T=T, E=6, M=5, requires_grad=True))


def _backward_nodes(tensor):
    """The names of the autograd nodes along the first inputs from `tensor` back to a leaf."""
    names, node = [], tensor.grad_fn
    while node is not None and node.next_functions:
        names.append(type(node).__name__)
        node = node.next_functions[0][0]
    return names


def test_eager_calls_run_the_functions_themselves(make_inputs):
    # eager pays no custom-op dispatch: the outputs hang off the hand-written Functions' nodes
    q, k, v, beta, state = make_inputs(T=20, requires_grad=True)
    assert "ChunkedSumBackward" in _backward_nodes(fast_weight_sum(q, k, v, state)[0])
    assert "ChunkedDeltaBackward" in _backward_nodes(fast_weight_delta(q, k, v, beta)[0])


def test_compile_calls_the_custom_op_not_the_function(make_inputs):
    # dynamo's graph holds the op, opaque; tracing the Function itself fails on its backward
    backend = torch._dynamo.testing.EagerAndRecordGraphs()
    q, k, v, beta, state = make_inputs(T=100, requires_grad=True)
    torch.compile(fast_weight_delta, backend=backend, fullgraph=True)(q, k, v, beta, state)
    targets = {str(node.target) for graph in backend.graphs for node in graph.graph.nodes}
    assert "fw_fairseq.chunked_delta" in targets


def test_bad_arguments_fail_with_the_ops_message_while_tracing(make_inputs):
    q, k, v, beta, _ = make_inputs(T=20)
    # without fullgraph, as the error would be raised eagerly: fullgraph wraps it in dynamo's Unsupported
    compiled = torch.compile(fast_weight_delta, backend="aot_eager")
    with pytest.raises(ValueError, match=r"fast_weight_delta: beta has shape \(2, 3, 19\)"):
        compiled(q, k, v, beta[..., 1:])
