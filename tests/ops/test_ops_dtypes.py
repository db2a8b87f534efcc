"""The one dtype rule of the public ops: results (outputs and states) are float32 for fp16/bf16
inputs and in the input dtype for float32/float64, so that nothing a fast weight sums over the
sequence is stored in half precision."""
import pytest
import torch

from fw_fairseq.ops import elu_plus_one, fast_weight_attend, fast_weight_read, fast_weight_sum, fast_weight_write
from fw_fairseq.ops.rules.sum.naive import quadratic_sum
from public_ops import OP_IDS, PUBLIC_OPS

RESULT_DTYPE = {torch.float16: torch.float32, torch.bfloat16: torch.float32,
                torch.float32: torch.float32, torch.float64: torch.float64}


@pytest.mark.parametrize("dtype", list(RESULT_DTYPE), ids=str)
@pytest.mark.parametrize("name,T,call", PUBLIC_OPS, ids=OP_IDS)
def test_results_in_the_documented_dtype(make_inputs, name, T, call, dtype):
    results = call(*make_inputs(B=2, H=2, T=T, E=6, M=5, dtype=dtype))
    assert [r.dtype for r in results] == [RESULT_DTYPE[dtype]] * len(results)


def _elu_inputs(T, E, D, seed=0):
    """ELU+1 features and values with the sum rule's z column (a ones column appended), as the
    attention module builds them: q, k [1, 2, T, E], v [1, 2, T, D + 1]."""
    g = torch.Generator().manual_seed(seed)
    q, k = (elu_plus_one(torch.randn(1, 2, T, E, generator=g, dtype=torch.float64)) for _ in range(2))
    v = torch.randn(1, 2, T, D, generator=g, dtype=torch.float64)
    return q, k, torch.cat([v, torch.ones(1, 2, T, 1, dtype=torch.float64)], -1)


@pytest.mark.parametrize("op", ["causal", "attend", "write-read"])
def test_fp16_sum_rule_does_not_overflow(op):
    # T = 2048, E = 64: the z column z . phi(q) grows like 85 t and passes fp16's largest value,
    # 65504, from t = 630..660 here; fp16 outputs held inf there and y = numerator / z read 0 or nan.
    q, k, v = _elu_inputs(T=2048, E=64, D=16)
    half = [x.half() for x in (q, k, v)]
    if op == "causal":
        o = fast_weight_sum(*half)[0]
        ref = quadratic_sum(*(x.double() for x in half))
    elif op == "attend":
        o = fast_weight_attend(*half)
        ref = half[0].double() @ (half[1].double().transpose(-1, -2) @ half[2].double())
    else:
        o = fast_weight_read(half[0], fast_weight_write(half[1], half[2]))
        ref = half[0].double() @ (half[1].double().transpose(-1, -2) @ half[2].double())
    assert ref[..., -1].max() > 65504  # the case this test is about
    assert o.dtype == torch.float32 and torch.isfinite(o).all()
    y, y_ref = o[..., :-1].double() / o[..., -1:].double(), ref[..., :-1] / ref[..., -1:]
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-5)
