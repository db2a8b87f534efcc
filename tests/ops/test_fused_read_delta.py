"""The delta rule's fused read (fw_fairseq/ops/rules/delta/fused_read.py) against the composition it replaces, in
float64: phi of the raw heads normalised as the feature maps do it (FeatureMap.normalized), then the rules' ops over
those features (fast_weight_delta, fast_weight_gated_delta causal, fast_weight_attend otherwise); outputs and the
gradients of q, k, v, beta (and alpha) under a random upstream gradient. On a GPU the kernels run compiled on CUDA
tensors, in float32; without one, under Triton's interpreter on CPU tensors, in float64 (fused_parity.py)."""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton decorates a kernel (as tests/conftest.py)

triton = pytest.importorskip("triton")

from fw_fairseq.ops.maps.factory import feature_map  # noqa: E402
from fw_fairseq.ops.rules.delta.fused_read import delta_read  # noqa: E402
from fw_fairseq.ops.fused_read.launch import map_spec  # noqa: E402
from fw_fairseq.ops.rules.public import (fast_weight_attend, fast_weight_delta, fast_weight_gated_delta,  # noqa: E402
                                         fused_read)
from fused_parity import DEVICE, DTYPE, assert_parity, assert_read_parity, leaves, maps  # noqa: E402

MAPS = {"dpfp": dict(nu=2), "elu": {}, "hedgehog": {}, "favor": dict(m=12)}


def reference(phi, q, k, v, beta, alpha, causal, norm):
    """The rule's read over materialised, normalised features."""
    qh, kh = phi.normalized(q, True, norm), phi.normalized(k, False, norm)
    if not causal:
        return fast_weight_attend(qh, kh, v, beta, alpha)
    if alpha is None:
        return fast_weight_delta(qh, kh, v, beta)[0]
    return fast_weight_gated_delta(qh, kh, v, beta, alpha)[0]


def values(B, H, Tq, T, d, M, gated, beta_max=1.0, pad=0, seed=0):
    """q, k, v, beta in (0, beta_max), alpha in (0.5, 1) or None, float64 on the CPU; batch entry 1's first `pad`
    positions padded (beta = 0, v = 0, alpha = 1), as the attention module passes a left-padded source."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(*shape, generator=g, dtype=torch.float64) for shape in
               ((B, H, Tq, d), (B, H, T, d), (B, H, T, M)))
    beta = beta_max * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    alpha = 0.5 + 0.5 * torch.rand(B, H, T, generator=g, dtype=torch.float64) if gated else None
    if pad:
        v[1, :, :pad] = 0.0
        beta[1, :, :pad] = 0.0
        if gated:
            alpha[1, :, :pad] = 1.0
    return [q, k, v, beta, alpha]


def inputs(*args, dtype=DTYPE, **kw):
    """values(...) as leaves of `dtype` on DEVICE."""
    return [x if x is None else x.to(DEVICE, dtype).requires_grad_() for x in values(*args, **kw)]


def check(name, d, Tq, T, causal, norm="sum", gated=False, M=5, B=2, H=1, **kw):
    phi, phi_ref = maps(feature_map(name, d, **{**MAPS[name], **kw.pop("map", {})}))
    kernel, ref_leaves = leaves(values(B, H, Tq, T, d, M, gated, **kw))
    wrt, ref_wrt = ([x for x in xs if x is not None] for xs in (kernel, ref_leaves))
    ref = reference(phi_ref, *ref_leaves, causal, norm)
    assert_read_parity(delta_read(map_spec(phi), *kernel, causal, norm), ref, wrt, ref_wrt)


@pytest.mark.parametrize("norm", ["sum", "l2"])
@pytest.mark.parametrize("name", sorted(MAPS))
def test_every_map_and_norm(name, norm):
    check(name, 8, 17, 17, causal=True, norm=norm, pad=4)


@pytest.mark.parametrize("gated", [False, True], ids=["delta", "gated"])
@pytest.mark.parametrize("mode", ["encoder", "cross", "one query"])
def test_non_causal_reads_left_padding(mode, gated):
    Tq, T = {"encoder": (17, 17), "cross": (9, 17), "one query": (1, 17)}[mode]
    check("elu" if gated else "dpfp", 8, Tq, T, causal=False, norm="sum" if gated else "l2", gated=gated, pad=T // 3)


@pytest.mark.parametrize("name, norm", [("hedgehog", "sum"), ("favor", "l2")])
def test_causal_gated(name, norm):
    check(name, 8, 17, 17, causal=True, norm=norm, gated=True, pad=5)


@pytest.mark.parametrize("T", [1, 64, 65, 200])
def test_lengths_across_blocks(T):
    check("dpfp", 4, T, T, causal=True, B=1, map=dict(nu=1))


def test_gated_across_blocks_and_cross_longer_than_a_block():
    check("dpfp", 4, 65, 65, causal=True, norm="l2", gated=True, B=1, map=dict(nu=1))
    check("elu", 4, 70, 100, causal=False, gated=True, pad=30)


def test_beta_up_to_two():
    check("dpfp", 8, 40, 40, causal=True, norm="l2", beta_max=2.0, B=1)


def test_widest_features_and_favor_projection_wider_than_a_chunk():
    phi = feature_map("dpfp", 64, nu=4)
    assert phi.out_dim == 512
    check("dpfp", 64, 5, 7, causal=False, B=1, map=dict(nu=4))
    check("favor", 7, 12, 12, causal=True, norm="l2", B=1, map=dict(m=40))


def test_float32_heads_and_output_layout():
    phi = feature_map("dpfp", 8, nu=2).to(DEVICE)
    q, k, v, beta, alpha = inputs(2, 2, 20, 20, 8, 6, True, dtype=torch.float32)
    out = delta_read(map_spec(phi), q, k, v, beta, alpha, True, "l2")
    ref = reference(phi.double(), *(x.double() for x in (q, k, v, beta, alpha)), True, "l2")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4)
    # written as [Tq, B, H, M]: the module's merge into [Tq, B, C] is a view
    assert out.permute(2, 0, 1, 3).is_contiguous()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_heads_read_in_float32(dtype):
    phi = feature_map("elu", 8).to(DEVICE)
    q, k, v, beta, alpha = inputs(2, 1, 20, 20, 8, 6, True)
    half = [x.detach().to(dtype).requires_grad_() for x in (q, k, v)]
    out = delta_read(map_spec(phi), *half, beta.float(), alpha.float(), True, "sum")
    ref = reference(phi.double(), *(x.double() for x in (*half, beta, alpha)), True, "sum")
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)
    out.sum().backward()
    assert all(x.grad.dtype == dtype and x.grad.isfinite().all() for x in half)


def test_forward_alone_where_nothing_records():
    phi, phi_ref = maps(feature_map("elu", 8))
    (q, k, v, beta, _), (rq, rk, rv, rbeta, _) = leaves(values(2, 1, 9, 9, 8, 3, False))
    with torch.no_grad():
        alone = delta_read(map_spec(phi), q, k, v, beta, None, True, "sum")
        ref = reference(phi_ref, rq, rk, rv, rbeta, None, True, "sum")
    assert_parity(alone, ref, "out")


def test_bad_inputs_one_line_naming_the_argument():
    """Through the public entry, which checks the heads and scalars once for every rule (fused_read/dispatch.read)."""
    phi = feature_map("dpfp", 8, nu=2).to(DTYPE)
    q, k, v, beta, alpha = inputs(1, 1, 4, 4, 8, 3, True)
    cases = [
        (dict(beta=beta[..., :3]), "beta has shape"),
        (dict(alpha=alpha[:, :, None]), "alpha has shape"),
        (dict(q=q[:, :, :3]), "causal read needs as many queries"),
        (dict(norm="max"), "norm='max'"),
        (dict(q=q[..., :6], k=k[..., :6]), r"q has shape \(1, 1, 4, 6\), expected \[B, H, Tq, d\] = \[B, H, Tq, 8\]"),
    ]
    for change, words in cases:
        args = {**dict(q=q, k=k, v=v, beta=beta, alpha=alpha, norm="sum"), **change}
        with pytest.raises(ValueError, match=words) as err:
            fused_read(phi, "gated_delta", args["q"], args["k"], args["v"], (args["beta"], args["alpha"]), True,
                       norm=args["norm"])
        assert "\n" not in str(err.value)
    long = inputs(1, 1, 257, 257, 8, 3, False)
    with pytest.raises(ValueError, match="1..256 positions"):
        fused_read(phi, "delta", *long[:3], (long[3],), True, norm="sum")
