"""`--criterion fw_attention_distillation` (fw_fairseq/criterions/attention_distillation.py): its loss is 0 where the
fast-weight attention's weights equal the teacher's softmax weights (a test-only phi that reproduces softmax exactly
on a tiny case), positive otherwise; its gradient reaches only the feature maps' parameters; the teacher's weights
are causal and padding-masked; a model without learned maps is refused in one line."""
import math
from types import SimpleNamespace

import pytest
import torch

from factories import build_model, random_tokens
from fw_fairseq.criterions.attention_distillation import (AttentionDistillationCriterion, attention_weights,
                                                         kl_rows)
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
    model, d = build_model(T2R + ["--fw-update-rule", "sum", "--fw-decoder-rule", "sum"])
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
    assert isinstance(model.encoder.layers[0].self_attn, FastWeightAttention)
