"""The sum rule's fused read with the aligned cross-attention's weight (--fw-cross-align P; the rule's fused_aligned)
against its definition, in float64: P = w * mask(phi(q) phi(k)^T) with w(i, j) = cos^(2P)((a_i - b_j) / 2) of the
target's and the source's angles (fw_fairseq/modules/cross_align.py), y = P v / (rowsum(P) + Z_EPS), outputs and the
gradients of q, k and v. Without a GPU the kernels run under Triton's interpreter on CPU tensors (fused_parity.py)."""
import pytest
import torch

triton = pytest.importorskip("triton")

from fw_fairseq.modules.cross_align import source_angles, source_lengths, target_angles  # noqa: E402
from fw_fairseq.ops.common.z_column import Z_EPS  # noqa: E402
from fw_fairseq.ops.fused_read import dispatch  # noqa: E402
from fw_fairseq.ops.maps.factory import feature_map  # noqa: E402
from fw_fairseq.ops.rules.registry import RULES  # noqa: E402
from fused_parity import DEVICE, assert_read_parity, leaves, maps  # noqa: E402
from test_fused_read_sum import MAPS, padding, values  # noqa: E402


@pytest.fixture(autouse=True)
def fused_read_on_this_device(monkeypatch):
    monkeypatch.setattr(dispatch, "DEVICES", (DEVICE,))


def angles(B, Tq, T, mask):
    """(a [B, Tq], b [B, T]) of target positions 0..Tq-1 over the sources of key_padding_mask (or T tokens)."""
    lengths = source_lengths(mask, B, T, DEVICE)
    target = torch.arange(Tq, device=DEVICE, dtype=torch.float64).expand(B, -1)
    return target_angles(target, lengths, 1.0), source_angles(mask, lengths, T)


def reference(phi, q, k, v, order, angle, mask):
    """The sum rule's read with its scores weighed by the definition of w, the z column divided out."""
    pk = phi(k, is_query=False)
    if mask is not None:
        pk = pk.masked_fill(mask[:, None, :, None], 0.0)  # a padded key writes nothing (its z entry is 0)
    weight = torch.cos((angle[0][:, :, None] - angle[1][:, None, :]) / 2) ** (2 * order)  # [B, Tq, T]
    scores = (phi(q, is_query=True) @ pk.transpose(-1, -2)) * weight[:, None]  # [B, H, Tq, T]
    return scores @ v / (scores.sum(-1, keepdim=True) + Z_EPS)


def check(name, order, Tq, T, side="left", d=8, M=5, B=2, H=2):
    phi, phi_ref = maps(feature_map(name, d, **MAPS[name]))
    (q, k, v), (rq, rk, rv) = leaves(values(B, H, Tq, T, d, M))
    mask = padding(B, T, side)
    angle = angles(B, Tq, T, mask)
    ref = reference(phi_ref, rq, rk, rv, order, angle, mask)
    out = dispatch.fused_aligned_read_for(phi, RULES["sum"], order, angle, q, k, v, mask)
    assert_read_parity(out, ref, (q, k, v), (rq, rk, rv))


@pytest.mark.parametrize("name", sorted(MAPS))
def test_every_map_left_padded_source(name):
    check(name, 4, 9, 13)


@pytest.mark.parametrize("order", [1, 2, 4])
def test_orders_and_targets_past_the_source(order):
    check("dpfp", order, 21, 11, side="right")  # a target position past the source's length aligns with its last


def test_lengths_across_blocks():
    check("dpfp", 4, 70, 66, side=None, d=4, M=3, B=1, H=1)


def test_where_it_does_not_take_the_block():
    phi = feature_map("dpfp", 8, nu=2).to(DEVICE, torch.float64)
    (q, k, v), _ = leaves(values(1, 1, 3, 4, 8, 5))
    angle = angles(1, 3, 4, None)
    assert dispatch.fused_aligned_read_for(phi, RULES["delta"], 4, angle, q, k, v, None) is None  # no fused form
    wide = feature_map("dpfp", 64, nu=4).to(DEVICE, torch.float64)  # E = 512, past the aligned entry's 256
    (q, k, v), _ = leaves(values(1, 1, 3, 4, 64, 5))
    assert dispatch.fused_aligned_read_for(wide, RULES["sum"], 4, angle, q, k, v, None) is None
