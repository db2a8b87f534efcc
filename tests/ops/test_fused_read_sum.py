"""The sum rule's fused read (fw_fairseq/ops/fused_read/) against the composition it replaces, in float64: phi of the
raw heads as the feature maps form it, P = mask(phi(q) phi(k)^T), y = P v / (rowsum(P) + Z_EPS), outputs and the
gradients of q, k and v under a random upstream gradient. On a GPU the kernels run compiled on CUDA tensors, in float32;
without one, under Triton's interpreter (tests/conftest.py) on CPU tensors, in float64 (fused_parity.py)."""
import pytest
import torch

triton = pytest.importorskip("triton")

from fw_fairseq.ops.maps.factory import feature_map  # noqa: E402
from fw_fairseq.ops.rules.public import fused_read  # noqa: E402
from fw_fairseq.ops.common.z_column import Z_EPS  # noqa: E402
from fused_parity import DEVICE, DTYPE, assert_read_parity, leaves, maps  # noqa: E402

MAPS = {"dpfp": dict(nu=2), "elu": {}, "hedgehog": {}, "favor": dict(m=12)}


def reference(phi, q, k, v, causal, mask):
    """The sum rule's read over materialised features, the z column divided out."""
    pk = phi(k, is_query=False)
    if mask is not None:
        pk = pk.masked_fill(mask[:, None, :, None], 0.0)  # a padded key writes nothing (its z entry is 0)
    scores = phi(q, is_query=True) @ pk.transpose(-1, -2)  # [B, H, Tq, T]
    if causal:
        scores = scores.tril()
    return scores @ v / (scores.sum(-1, keepdim=True) + Z_EPS)


def values(B, H, Tq, T, d, M, seed=0):
    """q, k, v as float64 CPU tensors (fused_parity.leaves gives the kernel and the reference each their own)."""
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, Tq, d), (B, H, T, d), (B, H, T, M))
    return [torch.randn(*shape, generator=g, dtype=torch.float64) for shape in shapes]


def heads(B, H, Tq, T, d, M, dtype=DTYPE):
    return [x.to(DEVICE, dtype).requires_grad_() for x in values(B, H, Tq, T, d, M)]


def padding(B, T, side):
    mask = torch.zeros(B, T, dtype=torch.bool)
    if side == "left":  # fairseq's sources
        mask[-1, : T // 3] = True
    elif side == "right":
        mask[-1, T - T // 3:] = True
    return mask.to(DEVICE) if side else None


def check(name, d, Tq, T, causal, side=None, M=5, B=2, H=2, **kw):
    phi, phi_ref = maps(feature_map(name, d, **{**MAPS[name], **kw}))
    (q, k, v), (rq, rk, rv) = leaves(values(B, H, Tq, T, d, M))
    mask = padding(B, T, side)
    ref = reference(phi_ref, rq, rk, rv, causal, mask)
    out = fused_read(phi, "sum", q, k, v, (), causal, key_padding_mask=mask)
    assert_read_parity(out, ref, (q, k, v), (rq, rk, rv))


@pytest.mark.parametrize("name", sorted(MAPS))
@pytest.mark.parametrize("mode", ["causal", "encoder", "cross"])
def test_every_map_and_mode(name, mode):
    Tq, T = (9, 17) if mode == "cross" else (17, 17)
    check(name, 8, Tq, T, causal=mode == "causal", side=None if mode == "causal" else "left")


@pytest.mark.parametrize("T", [1, 64, 65, 200])
def test_lengths_across_blocks(T):
    check("dpfp", 4, T, T, causal=True)


def test_longest_sequence_non_causal_right_padding():
    check("elu", 8, 256, 256, causal=False, side="right", M=3, B=1, H=1)


@pytest.mark.parametrize("d, nu, E", [(32, 1, 64), (32, 2, 128), (64, 2, 256), (64, 4, 512)])
def test_feature_widths(d, nu, E):
    phi = feature_map("dpfp", d, nu=nu)
    assert phi.out_dim == E
    check("dpfp", d, 5, 7, causal=False, nu=nu, B=1, H=1)


def test_odd_head_width_and_favor_projection_wider_than_a_chunk():
    check("favor", 7, 12, 12, causal=True, m=40)


def test_float32_heads_and_output_layout():
    phi = feature_map("dpfp", 8, nu=2).to(DEVICE)
    q, k, v = heads(3, 2, 20, 20, 8, 6, dtype=torch.float32)
    out = fused_read(phi, "sum", q, k, v, (), True)
    ref = reference(phi.double(), *(x.double() for x in (q, k, v)), True, None)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-5)
    # written as [Tq, B, H, M]: the module's merge into [Tq, B, C] is a view
    assert out.permute(2, 0, 1, 3).is_contiguous()


@pytest.mark.skipif(DEVICE != "cuda", reason="float64 is refused on CUDA only: the interpreter runs it")
def test_float64_heads_on_cuda_refused_in_one_line():
    phi = feature_map("dpfp", 8, nu=2).double().to(DEVICE)
    with pytest.raises(ValueError, match="q has dtype torch.float64; allowed: float16, bfloat16, float32") as err:
        fused_read(phi, "sum", *heads(1, 1, 4, 4, 8, 3, dtype=torch.float64), (), True)
    assert "\n" not in str(err.value)


def test_bad_inputs_one_line_naming_the_argument():
    phi = feature_map("dpfp", 8, nu=2).to(DTYPE)
    q, k, v = heads(1, 1, 4, 4, 8, 3)
    cases = [
        (dict(q=q[..., :6]), r"q has shape \(1, 1, 4, 6\), expected \[B, H, Tq, d\] = \[B, H, Tq, 8\]"),
        (dict(k=k[..., :6]), "k "),
        (dict(v=v[:, :, :3]), "v "),
        (dict(k=k[:, :, :3], v=v[:, :, :3]), "causal read needs as many queries"),
        (dict(q=q.int()), "q has dtype"),
    ]
    for change, words in cases:
        args = {**dict(q=q, k=k, v=v), **change}
        with pytest.raises(ValueError, match=words) as err:
            fused_read(phi, "sum", args["q"], args["k"], args["v"], (), True)
        assert "\n" not in str(err.value)
    long = heads(1, 1, 257, 257, 8, 3)
    with pytest.raises(ValueError, match="1..256 positions"):
        fused_read(phi, "sum", *long, (), True)
    with pytest.raises(ValueError, match="rule='softmax' has no fused form"):
        fused_read(phi, "softmax", q, k, v, (), True)
    with pytest.raises(ValueError, match="scalars must be a tuple of 1"):
        fused_read(phi, "delta", q, k, v, (), True, norm="l2")
