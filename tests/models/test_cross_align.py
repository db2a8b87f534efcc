"""--fw-cross-align: the aligned cross-attention is the weighted read of its definition (float64, outputs and
gradients), generation's steps and beam search's reorders equal the teacher-forced forward, and a checkpoint
records the flag (its bad values: test_padding_and_options.py)."""
import math

import pytest
import torch

from factories import build_model, check_steps_through_reorders, decode_step_by_step, random_tokens
from fw_fairseq.decoding.block import Block
from fw_fairseq.modules.cross_align import align_factors, aligned_read, aligned_step
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_fairseq.ops import RULES, feature_map
from fw_fairseq.ops.common.positions import with_positions
from fw_fairseq.ops.common.z_column import Z_EPS

FW = ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-update-rule", "sum",
      "--fw-decoder-rule", "sum"]


def naive_read(phi, q, k, v, mask, order, ratio=1.0):
    """The definition, one query and one source position at a time: y_i = sum_j w_ij phi(q_i).phi(k_j) v_j over
    sum_j w_ij phi(q_i).phi(k_j), w_ij = cos^(2P)((a_i - b_j) / 2), a_i = pi min(i / r, N) / N, b_j = pi j / N."""
    rows = []
    for b in range(q.size(0)):
        length = int((~mask[b]).sum())
        pad = mask.size(1) - length  # left padding
        heads = []
        for h in range(q.size(1)):
            pq, pk = phi(q[b, h], is_query=True), phi(k[b, h], is_query=False)
            reads = []
            for i in range(q.size(2)):
                a = math.pi * min(i / ratio, length) / length
                w = torch.stack([torch.cos(torch.tensor((a - math.pi * j / length) / 2, dtype=q.dtype)) ** (2 * order)
                                 for j in range(length)])
                scores = (pk[pad:] @ pq[i]) * w  # [N]
                reads.append(scores @ v[b, h, pad:] / (scores.sum() + Z_EPS))
            heads.append(torch.stack(reads))
        rows.append(torch.stack(heads))
    return torch.stack(rows)


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(0)
    shape = (3, 2)
    q = torch.randn(*shape, 7, 8, generator=g, dtype=torch.float64, requires_grad=True)
    k = torch.randn(*shape, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(*shape, 6, 8, generator=g, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(3, 6, dtype=torch.bool)
    mask[1, :2], mask[2, :1] = True, True  # fairseq pads sources on the left
    return q, k, v, mask


@pytest.mark.parametrize("order,ratio", [(1, 1.0), (3, 1.0), (3, 1.5), (2, 0.7)])
def test_aligned_read_is_the_weighted_read(inputs, order, ratio):
    q, k, v, mask = inputs
    phi = feature_map("dpfp", 8, nu=2)
    block = Block.of(RULES["sum"], phi, "sum")
    v_written = v.masked_fill(mask[:, None, :, None], 0.0)  # the module zeroes padded values
    out = aligned_read(block, order, ratio, q, k, v_written, (), mask, torch.float64)
    ref = naive_read(phi, q, k, v, mask, order, ratio)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(ref, (q, k, v), grad)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_free_heads_read_without_the_prior(inputs):
    """--fw-align-free-heads 1 of 2: the first head reads as with the prior, the second as the plain read (w = 1),
    outputs and gradients."""
    q, k, v, mask = inputs
    phi = feature_map("dpfp", 8, nu=2)
    block = Block.of(RULES["sum"], phi, "sum")
    v_written = v.masked_fill(mask[:, None, :, None], 0.0)
    out = aligned_read(block, 3, 1.5, q, k, v_written, (), mask, torch.float64, free=1)
    ref = torch.cat([naive_read(phi, q, k, v, mask, 3, 1.5)[:, :1], naive_read(phi, q, k, v, mask, 0)[:, 1:]], 1)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grad = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_aligned_features_keep_the_norm_and_weigh_by_the_window():
    """An L2-normalised phi (a delta rule's) stays normalised: the binomial weights sum to 4^P; and the factors'
    product is the window cos^(2P)((a - b) / 2)."""
    phi = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    angle = torch.rand(2, 5, dtype=torch.float64) * math.pi
    for order in (1, 4):
        factors = align_factors(angle, order)  # [2, 5, 2 order + 1]
        torch.testing.assert_close(with_positions(phi, factors).norm(dim=-1), phi.norm(dim=-1))
        window = torch.cos((angle[:, :, None] - angle[:, None, :]) / 2) ** (2 * order)
        torch.testing.assert_close(factors @ factors.transpose(-1, -2), window)


@pytest.mark.parametrize("ratio,free", [(1.0, 0), (1.5, 0), (1.5, 1), (0.7, 0)])
def test_steps_equal_the_read(inputs, ratio, free):
    q, k, v, mask = (x.detach() for x in inputs)
    block = Block.of(RULES["sum"], feature_map("dpfp", 8, nu=2), "sum")
    v = v.masked_fill(mask[:, None, :, None], 0.0)
    full = aligned_read(block, 2, ratio, q, k, v, (), mask, torch.float64, free)
    buffer = {}
    steps = [aligned_step(buffer, block, 2, ratio, q[:, :, t:t + 1], (k, v, ()) if t == 0 else None, mask, 1, free)
             for t in range(q.size(2))]
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-12, atol=1e-12)


# the short sources' cached form (keys' features, the weights of their target positions and writes) and the memory's
# (source_memory.write_positioned_source: from S (E + I + M) >= E R M, I = S + 1, S >= 42-44 here); the sum rule and
# the delta rule over the source
@pytest.mark.parametrize("lengths,cross_rule,free", [([7, 3, 5], "sum", "0"), ([70, 9, 33], "sum", "0"),
                                                     ([7, 3, 5], "delta", "0"), ([70, 9, 33], "delta", "0"),
                                                     ([7, 3, 5], "delta", "1"), ([70, 9, 33], "sum", "1")])
def test_generation_equals_teacher_forced_with_padding_and_beams(lengths, cross_rule, free):
    """Left-padded sources of different lengths, fairseq's beam layout, a reorder within sentences, then one that
    mixes them: every step equals the forward over the whole prefix (with a head free of the prior too)."""
    model, d = build_model(FW + ["--fw-cross-align", "2", "--fw-cross-rule", cross_rule,
                                 "--fw-align-free-heads", free])
    beam, longest = 2, max(lengths)
    model.set_beam_size(beam)
    g = torch.Generator().manual_seed(4)
    src = torch.full((3, longest), d.pad())
    for i, n in enumerate(lengths):
        src[i, longest - n:] = random_tokens(d, 1, n, g)[0]
    src, src_lengths = src.repeat_interleave(beam, dim=0), torch.tensor(lengths).repeat_interleave(beam)
    prev = random_tokens(d, 3 * beam, 9, g)  # past the shortest source's length
    state = {}
    encoder_out = model.encoder(src, src_lengths=src_lengths)
    decode_step_by_step(model, prev[:, :4], encoder_out, state)
    check_steps_through_reorders(model, src, src_lengths, prev, encoder_out, state,
                                 [(4, torch.tensor([1, 0, 3, 2, 4, 5])), (5, torch.tensor([0, 2, 3, 1, 4, 5])),
                                  (6, None), (7, None), (8, None)])


def test_recorded_for_fast_weight_and_softmax_cross_attention():
    """A softmax cross-attention takes the prior too (aligned_softmax.py), so every record keeps the prior, its
    ratio and its free heads: a plain softmax model's record says 0."""
    def settings(places, align, ratio=1.0):
        return FastWeightConfig(feature_map="dpfp", update_rule="sum", dpfp_nu=2, favor_features=16,
                                places=frozenset(places), cross_align=align, align_ratio=ratio).settings()
    assert settings({"encoder", "decoder", "cross"}, 2)["--fw-cross-align"] == "2"
    assert settings({"encoder", "decoder"}, 3, 1.5)["--fw-cross-align"] == "3"
    assert settings({"encoder", "decoder"}, 3, 1.5)["--fw-align-ratio"] == "1.5"
    assert settings(set(), 0) == {"--fw-attention": "none", "--fw-cross-align": "0", "--fw-align-ratio": "1",
                                  "--fw-align-free-heads": "0"}

