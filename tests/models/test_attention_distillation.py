"""`--criterion fw_attention_distillation` (fw_fairseq/criterions/attention_distillation.py): its loss is 0 where the
fast-weight attention's weights equal the teacher's softmax weights (a test-only phi that reproduces softmax exactly
on a tiny case), positive otherwise; the weights it distils under the aligned cross-attention are the aligned read's,
and a delta-rule block is matched on its own read; its gradient reaches only the feature maps' parameters, or with
`--distil-trains projections` also the q, k and beta projections, whose teacher stays the converted checkpoint's; the
teacher's weights are causal and padding-masked; a model without anything to train is refused in one line."""
import math
from types import SimpleNamespace

import pytest
import torch

from factories import build_model, random_tokens, randomize_scalar_projections
from fw_fairseq.criterions.attention_distillation import (AttentionDistillationCriterion, attention_weights,
                                                         block_loss, kl_rows, student_read)
from fw_fairseq.decoding.block import Block
from fw_fairseq.modules import FastWeightAttention
from fw_fairseq.ops import FeatureMap

T2R = ["--fw-feature-map", "t2r", "--fw-t2r-features", "8"]


class SoftmaxOfTheseKeys(FeatureMap):
    """phi(k_s) = e_s for the keys K [B, H, S, d] it is built with, phi(q) = exp(q K^T / sqrt(d)) [..., S]: then
    phi(q) . phi(k_s) = exp(q . k_s / sqrt(d)), and the sum rule's normalised weights are softmax(q K^T / sqrt(d))."""

    def __init__(self, keys):
        super().__init__(keys.shape[-1])
        self.keys = keys

    @property
    def out_dim(self):
        return self.keys.shape[-2]

    def forward(self, x, is_query):
        if is_query:
            return torch.exp(x @ self.keys.transpose(-1, -2) / math.sqrt(self.d_key))  # [B, H, T, S]
        return (x[..., :, None, :] == self.keys[..., None, :, :]).all(-1).to(x.dtype)  # [B, H, S, S]: one-hot


def _block(path, seed=0):
    torch.manual_seed(seed)
    model, d = build_model(T2R + ["--fw-update-rule", "sum", "--fw-decoder-rule", "sum", "--fw-cross-align", "0"])
    layer = model.decoder.layers[0]
    return (layer.self_attn if path == "causal" else layer.encoder_attn), d


@pytest.mark.parametrize("path", ["causal", "cross"])
def test_the_loss_is_zero_where_the_weights_are_the_teachers(path):
    attention, _ = _block(path)
    g = torch.Generator().manual_seed(1)
    query = torch.randn(4, 2, 32, dtype=torch.float64, generator=g)
    key = query if path == "causal" else torch.randn(5, 2, 32, dtype=torch.float64, generator=g)
    mask = None if path == "causal" else torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    with torch.no_grad():
        keys = attention._heads(attention.k_proj(key), torch.float32)  # [B, H, S, D]: the float32 heads it compares
    exact = SoftmaxOfTheseKeys(keys)
    attention.block = Block.of(attention.rule, exact, attention.delta_norm)
    teacher, student, rows = attention_weights(attention, query, key, mask)
    torch.testing.assert_close(student, teacher, rtol=1e-5, atol=1e-6)
    assert kl_rows(teacher, student, rows).abs() < 1e-4
    if path == "causal":
        assert (teacher.triu(1) == 0).all()  # position t weighs no later key
    else:
        assert (teacher[1, :, :, 3:] == 0).all()  # nor a padded one


def test_the_loss_is_positive_with_the_converted_map():
    attention, _ = _block("cross")
    query, key = torch.randn(4, 2, 32, dtype=torch.float64), torch.randn(5, 2, 32, dtype=torch.float64)
    teacher, student, rows = attention_weights(attention, query, key, None)
    assert kl_rows(teacher, student, rows) > 0.01 and rows.all()


def _sample(d, g):
    src, prev = random_tokens(d, 3, 6, g), random_tokens(d, 3, 5, g)
    src[2, :2] = d.pad()  # a left-padded source
    return {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([6, 6, 4]), "prev_output_tokens": prev},
            "ntokens": 15, "nsentences": 3}


@pytest.mark.parametrize("rule", ["sum", "delta"])
def test_its_gradient_reaches_only_the_feature_maps(rule):
    model, d = build_model(T2R + ["--fw-update-rule", rule, "--fw-decoder-rule", rule])
    model.train()
    criterion = AttentionDistillationCriterion(SimpleNamespace())
    loss, rows, log = criterion(model, _sample(d, torch.Generator().manual_seed(2)))
    assert torch.isfinite(loss) and loss > 0 and rows > 0
    loss.backward()
    reached = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    maps = {name for name, _ in model.named_parameters() if ".t2r." in name}
    assert reached == maps  # every block's map (the padded source's rows too) and nothing else
    assert all(p.requires_grad == (name in maps) for name, p in model.named_parameters())


def test_a_model_without_learned_maps_is_refused_in_one_line():
    model, d = build_model(["--fw-feature-map", "dpfp"])
    criterion = AttentionDistillationCriterion(SimpleNamespace())
    with pytest.raises(SystemExit) as err:
        criterion(model, _sample(d, torch.Generator().manual_seed(3)))
    message = str(err.value)
    assert "\n" not in message and "have no parameters to distil" in message and "Dpfp" in message
    assert "--distil-trains projections --distil-teacher" in message
    assert isinstance(model.encoder.layers[0].self_attn, FastWeightAttention)


def _inputs(g, source=5):
    query = torch.randn(4, 2, 32, dtype=torch.float64, generator=g)
    key = torch.randn(source, 2, 32, dtype=torch.float64, generator=g)
    return query, key, torch.tensor([[False] * source, [True] * 2 + [False] * (source - 2)])  # a left-padded source


@pytest.mark.parametrize("free", [0, 1])
def test_under_the_aligned_cross_attention_the_weights_distilled_are_the_aligned_reads(free):
    model, _ = build_model(["--fw-align-free-heads", str(free)])  # the translation defaults: --fw-cross-align 4
    attn = model.decoder.layers[0].encoder_attn
    assert attn.cross_align == 4 and attn.update_rule == "sum"
    query, key, mask = _inputs(torch.Generator().manual_seed(4))
    teacher, student, rows = attention_weights(attn, query, key, mask)
    v = attn._heads(attn.v_proj(key), torch.float32)  # [B, H, S, D]
    torch.testing.assert_close(student @ v, student_read(attn, query, key, mask), rtol=1e-4, atol=1e-5)
    attn.cross_align = 0  # the same block reading without the prior
    _, unweighted, _ = attention_weights(attn, query, key, mask)
    assert not torch.allclose(student[:, 0], unweighted[:, 0])  # the prior weighs the first head
    assert torch.allclose(student[:, 1], unweighted[:, 1]) == bool(free)  # and the free head reads without it
    assert (student[1, :, :, :2] == 0).all() and torch.allclose(student.sum(-1), torch.ones(()), atol=1e-3)


def test_a_delta_block_is_matched_on_its_own_read_against_the_teachers():
    model, _ = build_model()  # the translation defaults: the delta rule in the decoder's self-attention
    attn = randomize_scalar_projections(model.decoder.layers[0].self_attn, torch.Generator().manual_seed(5))
    x = torch.randn(4, 2, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    read = student_read(attn, x, x, None)  # [B, H, T, D]
    with torch.no_grad():
        torch.testing.assert_close(attn.out_proj(attn._merge(read, torch.float64)), attn(x, x, x)[0], rtol=1e-4,
                                   atol=1e-5)  # the read the block's forward projects out
    kind, loss, rows = block_loss(attn, x, x, None)
    teacher, _, _ = attention_weights(attn, x, x, None)
    target = teacher @ attn._heads(attn.v_proj(x), torch.float32)
    assert kind == "read_mse" and rows == 2 * 2 * 4
    torch.testing.assert_close(loss, (read - target).pow(2).mean(-1).sum().float(), rtol=1e-5, atol=1e-6)


def _converted(model, path):
    """`model` saved as a converted checkpoint is (what fw_research.convert.convert_softmax writes, less its cfg)."""
    torch.save({"args": None, "cfg": None, "model": model.state_dict(), "extra_state": {"train_iterator": {}},
                "optimizer_history": [{"criterion_name": "x", "optimizer_name": "x", "lr_scheduler_state": {},
                                       "num_updates": 0}]}, path)
    return str(path)


def test_projections_train_against_the_teacher_of_the_converted_checkpoint(tmp_path):
    model, d = build_model(dtype=torch.float32)  # DPFP: a map without parameters
    model.train()
    criterion = AttentionDistillationCriterion(SimpleNamespace(), distil_trains="projections",
                                               distil_teacher=_converted(model, tmp_path / "converted.pt"))
    sample = _sample(d, torch.Generator().manual_seed(7))
    loss, rows, log = criterion(model, sample)
    assert log["kl_rows"] > 0 and log["read_mse_rows"] > 0 and log["kl_rows"] + log["read_mse_rows"] == rows
    loss.backward()
    reached = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}
    allowed = {name for name, p in model.named_parameters()
               if any(f".{part}." in name for part in ("q_proj", "k_proj", "beta_proj"))}
    assert reached and reached <= allowed and any(".beta_proj." in name for name in reached)
    assert all(p.requires_grad == (name in allowed) for name, p in model.named_parameters())
    with torch.no_grad():  # the student moves; its teacher is still the converted checkpoint's
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(0.5 * p.grad.sign())
    moved, _, _ = criterion(model, sample)
    attn = model.decoder.layers[0].encoder_attn
    query, key, mask = _inputs(torch.Generator().manual_seed(8))
    with_file, _, _ = attention_weights(attn, query.float(), key.float(), mask, criterion.teachers[attn])
    own, _, _ = attention_weights(attn, query.float(), key.float(), mask)
    assert moved != loss and not torch.allclose(with_file, own)


@pytest.mark.parametrize("kwargs,message", [
    (dict(distil_trains="maps", distil_teacher="converted.pt"), "--distil-teacher goes with --distil-trains "
     "projections"),
    (dict(distil_trains="projections"), "--distil-teacher goes with --distil-trains projections"),
    (dict(distil_trains="projections", distil_teacher="missing.pt"), "--distil-teacher missing.pt: no such file"),
])
def test_a_teacher_without_projections_or_a_missing_one_is_refused_in_one_line(kwargs, message):
    with pytest.raises(SystemExit) as err:
        AttentionDistillationCriterion(SimpleNamespace(), **kwargs)
    assert "\n" not in str(err.value) and message in str(err.value)
