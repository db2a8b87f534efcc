"""Public entry points: gradcheck, non-causal write/read, input validation and the dispatch decision."""
from types import SimpleNamespace

import pytest
import torch

from fw_fairseq.ops import (fast_weight_delta, fast_weight_gated_delta, fast_weight_read, fast_weight_sum,
                            fast_weight_write)
from rule_runner import noncausal_reference as naive_noncausal


@pytest.mark.parametrize("T", [1, 5])
@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_gradcheck_causal(make_inputs, rule, T):
    q, k, v, beta, state = make_inputs(B=1, H=2, T=T, E=3, M=5, requires_grad=True)
    if rule == "sum":
        fn, args = (lambda q, k, v, s: fast_weight_sum(q, k, v, s, True)), (q, k, v, state)
    else:
        fn, args = (lambda q, k, v, b, s: fast_weight_delta(q, k, v, b, s, True)), (q, k, v, beta, state)
    assert torch.autograd.gradcheck(fn, args)


@pytest.mark.parametrize("delta", [False, True])
def test_gradcheck_write_read(make_inputs, delta):
    q, k, v, beta, _ = make_inputs(B=1, H=2, T=5, E=3, M=5, requires_grad=True)
    q = q[:, :, :3].detach().requires_grad_()  # a query length different from T

    def write_read(q, k, v, beta):
        return fast_weight_read(q, fast_weight_write(k, v, beta if delta else None))

    assert torch.autograd.gradcheck(write_read, (q, k, v, beta))


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("Tq", [1, 11, 40])
def test_write_read_matches_naive_noncausal(make_inputs, delta, Tq):
    q, k, v, beta, _ = make_inputs(T=29)
    q2 = make_inputs(T=Tq, seed=3)[0]
    b = beta if delta else None
    torch.testing.assert_close(
        fast_weight_read(q2, fast_weight_write(k, v, b)), naive_noncausal(q2, k, v, b), rtol=1e-10, atol=1e-10
    )


def test_write_delta_is_causal_final_state(make_inputs):
    q, k, v, beta, _ = make_inputs(T=70)
    torch.testing.assert_close(fast_weight_write(k, v, beta), fast_weight_delta(q, k, v, beta, None, True)[1])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_write_read_low_precision(make_inputs, dtype):
    q, k, v, beta, _ = make_inputs(T=29)
    state = fast_weight_write(k.to(dtype), v.to(dtype), beta.to(dtype))
    assert state.dtype == torch.float32
    o = fast_weight_read(q.to(dtype), state)
    assert o.dtype == torch.float32
    torch.testing.assert_close(o.double(), naive_noncausal(q, k, v, beta), rtol=5e-2, atol=5e-2)


def _good(B=2, H=3, T=4, E=5, M=6):
    return dict(
        q=torch.rand(B, H, T, E), k=torch.rand(B, H, T, E), v=torch.rand(B, H, T, M),
        beta=torch.rand(B, H, T), alpha=torch.rand(B, H, T), initial_state=torch.rand(B, H, E, M),
    )


BAD_CAUSAL = [
    ("q", torch.rand(2, 3, 4), "q.*rank"),
    ("k", torch.rand(2, 3, 4, 7), "k.*shape"),
    ("k", torch.rand(2, 3, 5, 5), "k.*shape"),
    ("v", torch.rand(2, 3, 5, 6), "v.*shape"),
    ("v", torch.rand(1, 3, 4, 6), "v.*shape"),
    ("v", torch.rand(2, 3, 4, 6, 1), "v.*rank"),
    ("beta", torch.rand(2, 3, 5), "beta.*shape"),
    ("beta", torch.rand(2, 3, 4, 1), "beta.*rank"),
    ("initial_state", torch.rand(2, 3, 6, 5), "initial_state.*shape"),
    ("initial_state", torch.rand(2, 3, 5), "initial_state.*rank"),
    ("q", torch.ones(2, 3, 4, 5, dtype=torch.long), "q.*dtype.*int64"),
    ("v", torch.ones(2, 3, 4, 6, dtype=torch.bool), "v.*dtype"),
    ("beta", torch.ones(2, 3, 4, dtype=torch.int32), "beta.*dtype"),
    ("initial_state", torch.zeros(2, 3, 5, 6, dtype=torch.complex64), "initial_state.*dtype"),
    ("k", torch.rand(2, 3, 4, 5, device="meta"), "k.*device"),
    ("initial_state", torch.rand(2, 3, 5, 6, device="meta"), "initial_state.*device"),
    ("q", [[1.0]], "q.*torch.Tensor"),
    ("q", torch.rand(2, 3, 0, 5), "T=0"),
    ("alpha", torch.rand(2, 3, 5), "alpha.*shape"),
    ("alpha", torch.rand(2, 3, 4, 1), "alpha.*rank"),
    ("alpha", torch.ones(2, 3, 4, dtype=torch.int32), "alpha.*dtype"),
    ("alpha", torch.rand(2, 3, 4, device="meta"), "alpha.*device"),
]
# which rule reads which per-position scalars
SCALARS = {"sum": (), "delta": ("beta",), "gated_delta": ("beta", "alpha")}
OPS = {"sum": fast_weight_sum, "delta": fast_weight_delta, "gated_delta": fast_weight_gated_delta}


CAUSAL_CASES = [(rule, *case) for rule in OPS for case in BAD_CAUSAL
                if case[0] not in ("beta", "alpha") or case[0] in SCALARS[rule]]


@pytest.mark.parametrize("rule,name,bad,match", CAUSAL_CASES, ids=lambda x: x if isinstance(x, str) else "")
def test_causal_rejects_bad_inputs(rule, name, bad, match):
    args = {key: x for key, x in _good().items() if key not in ("beta", "alpha") or key in SCALARS[rule]}
    args[name] = bad
    with pytest.raises(ValueError, match=match):
        OPS[rule](**args)


@pytest.mark.parametrize(
    "name,bad,match",
    [
        ("k", torch.rand(2, 3, 4), "k.*rank"),
        ("v", torch.rand(2, 3, 5, 6), "v.*shape"),
        ("beta", torch.rand(2, 4), "beta.*rank"),
        ("beta", torch.rand(2, 3, 5), "beta.*shape"),
        ("v", torch.ones(2, 3, 4, 6, dtype=torch.long), "v.*dtype"),
        ("beta", torch.rand(2, 3, 4, device="meta"), "beta.*device"),
        ("alpha", torch.rand(2, 3, 5), "alpha.*shape"),
        ("alpha", torch.rand(2, 3, 4, device="meta"), "alpha.*device"),
        ("beta", None, "alpha.*needs beta"),
    ],
)
def test_write_rejects_bad_inputs(name, bad, match):
    args = {key: value for key, value in _good().items() if key in ("k", "v", "beta", "alpha")}
    args[name] = bad
    with pytest.raises(ValueError, match=match):
        fast_weight_write(**args)


@pytest.mark.parametrize(
    "name,bad,match",
    [
        ("q", torch.rand(2, 3, 5), "q.*rank"),
        ("state", torch.rand(2, 3, 4, 6), "state.*shape"),
        ("state", torch.rand(2, 1, 5, 6), "state.*shape"),
        ("state", torch.rand(2, 3, 5), "state.*rank"),
        ("q", torch.ones(2, 3, 4, 5, dtype=torch.int64), "q.*dtype"),
        ("state", torch.rand(2, 3, 5, 6, device="meta"), "state.*device"),
    ],
)
def test_read_rejects_bad_inputs(name, bad, match):
    args = dict(q=torch.rand(2, 3, 4, 5), state=torch.rand(2, 3, 5, 6))
    args[name] = bad
    with pytest.raises(ValueError, match=match):
        fast_weight_read(**args)


def test_cpu_never_touches_the_cuda_extension(monkeypatch):
    # the dispatch picks the chunked path for CPU tensors before trying to import fw_fairseq._cuda
    import fw_fairseq.ops.kernels.cuda_extension as fw

    monkeypatch.setattr(fw, "_extension", None)
    assert fw.cuda_kernel(torch.rand(1, 1, 2, 3), torch.rand(1, 1, 2, 3), "delta") is None
    assert fw._extension is None


class _CudaLike:
    """What the dispatch reads of a CUDA tensor, on a machine without one."""

    def __init__(self, *shape, dtype=torch.float32):
        self.is_cuda, self.shape, self.dtype = True, shape, dtype


def test_dispatch_sends_each_rule_only_to_its_own_kernel(monkeypatch):
    import fw_fairseq.ops.kernels.cuda_extension as fw

    ungated = SimpleNamespace(MAX_E=512, MAX_M=160, sum_forward=None, delta_forward=None)  # no gated kernel
    monkeypatch.setattr(fw, "_extension", ungated)
    q, v = _CudaLike(2, 3, 5, 64), _CudaLike(2, 3, 5, 65)
    assert fw.cuda_kernel(q, v, "delta") is ungated
    assert fw.cuda_kernel(q, v, "gated_delta") is None
    # the limits are the extension's own
    assert fw.cuda_kernel(q, _CudaLike(2, 3, 5, 161), "delta") is None
    assert fw.cuda_kernel(q, _CudaLike(2, 3, 5, 160), "delta") is ungated
    assert fw.cuda_kernel(_CudaLike(2, 3, 5, 64, dtype=torch.float64), v, "delta") is None
