"""Memory models on the plugin ops: each rule computes what the paper says, and a tiny model learns."""
import pytest
import torch

from fw_fairseq.ops import dpfp, fast_weight_write, sum_normalize
from fw_fairseq.ops.rules.delta.naive import naive_gated_delta
from fw_research.synthetic import RetrievalMemory, TrainConfig, schlag_write, train, training_batch


@pytest.fixture(autouse=True)
def one_thread():
    """These tiny problems are overhead-bound: on a shared 2-core machine extra threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_sum_rule_is_normalised_linear_attention():
    torch.manual_seed(0)
    model = RetrievalMemory(6, "dpfp", "sum", arg=1).double()
    keys, values, queries, _ = training_batch(3, 6, 6, replace=False, generator=torch.Generator().manual_seed(0))
    queries = torch.arange(6).expand(3, 6)
    v_hat = model(keys, values, queries)  # [3, 6, 6]
    x = torch.cat([model.embed(keys), torch.nn.functional.one_hot(values, 6).double()], dim=-1)
    phi_k = dpfp(model.key_proj(x), 1)  # [3, L, E]
    phi_q = dpfp(model.query_proj(model.embed(queries)), 1)  # [3, Q, E]
    scores = phi_q @ phi_k.transpose(1, 2)  # [3, Q, L]
    expected = scores @ torch.nn.functional.one_hot(values, 6).double() / (scores.sum(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(v_hat, expected)


def _delta_loop(k, v, beta, clip):
    """Oracle: W <- W + beta k (v - W^T k)^T, then optionally W <- W / max(1, |W|_F), step by step."""
    W = torch.zeros(k.shape[0], k.shape[1], k.shape[-1], v.shape[-1], dtype=k.dtype)
    for t in range(k.shape[2]):
        k_t = k[:, :, t]
        delta = beta[:, :, t, None] * (v[:, :, t] - torch.einsum("bhe,bhem->bhm", k_t, W))
        W = W + k_t[..., None] * delta[..., None, :]
        if clip:
            W = W / W.flatten(2).norm(dim=-1).clamp_min(1.0)[..., None, None]
    return W


def test_schlag_write_is_delta_rule_with_norm_bound():
    torch.manual_seed(0)
    k = torch.tanh(torch.randn(2, 1, 7, 5, dtype=torch.float64))
    v = torch.randn(2, 1, 7, 3, dtype=torch.float64)
    beta = torch.rand(2, 1, 7, dtype=torch.float64)
    W = schlag_write(k, v, beta)
    torch.testing.assert_close(W, _delta_loop(k, v, beta, clip=True))
    assert (W.flatten(2).norm(dim=-1) <= 1 + 1e-12).all()
    # while the norm stays below 1 the bound is inactive: the plain delta write of the op
    small_k, small_v = 0.05 * k, 0.05 * v
    torch.testing.assert_close(schlag_write(small_k, small_v, beta), fast_weight_write(small_k, small_v, beta))


def test_favor_features_redrawn_in_training_fixed_in_eval():
    model = RetrievalMemory(5, "favor", "sum", arg=8)
    batch = training_batch(4, 5, 5, replace=False, generator=torch.Generator().manual_seed(0))[:3]
    before = model.phi_map.projection.clone()
    model.train()
    model(*batch)
    assert not torch.equal(before, model.phi_map.projection)
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(*batch), model(*batch), rtol=0, atol=0)


@pytest.mark.parametrize("feature_map, rule, arg", [("softmax", "sum", None), ("elu", "sum", None),
                                                    ("favor", "sum", 4), ("dpfp", "delta", 1),
                                                    ("dpfp", "gated_delta", 1), ("tanh", "schlag", None)])
def test_output_shape_and_d_dot(feature_map, rule, arg):
    model = RetrievalMemory(5, feature_map, rule, arg=arg, d_key=4)
    batch = training_batch(2, 5, 10, replace=True, generator=torch.Generator().manual_seed(0))[:3]
    assert model(batch[0], batch[1], torch.arange(5).expand(2, 5)).shape == (2, 5, 5)
    assert model.d_dot == {"softmax": None, "elu": 4, "favor": 8, "dpfp": 8, "tanh": 4}[feature_map]


def test_unknown_feature_map_or_rule_is_refused():
    with pytest.raises(ValueError, match="feature_map"):
        RetrievalMemory(5, "relu")
    with pytest.raises(ValueError, match="rule"):
        RetrievalMemory(5, "dpfp", "hebbian", arg=1)


def test_tiny_model_learns_setting1():
    torch.manual_seed(0)
    model = RetrievalMemory(8, "dpfp", "sum", arg=1)
    result = train(model, 8, 8, False, TrainConfig(max_steps=300, eval_every=50, seed=0))
    assert result["best_eval_loss"] < 1e-2, result["curve"]


def test_delta_rule_learns_to_overwrite_setting2():
    torch.manual_seed(0)
    model = RetrievalMemory(8, "dpfp", "delta", arg=1)
    result = train(model, 8, 16, True, TrainConfig(max_steps=250, eval_every=50, seed=0))
    assert result["best_eval_loss"] < 0.05, result["curve"]


def test_gated_rule_is_the_decayed_delta_write_of_normalised_features():
    torch.manual_seed(0)
    model = RetrievalMemory(6, "dpfp", "gated_delta", arg=1).double()
    keys, values, queries, _ = training_batch(3, 6, 9, replace=True, generator=torch.Generator().manual_seed(0))
    x = torch.cat([model.embed(keys), torch.nn.functional.one_hot(values, 6).double()], dim=-1)  # [3, L, .]
    phi_k = sum_normalize(dpfp(model.key_proj(x), 1))[:, None]  # [3, 1, L, E]
    phi_q = sum_normalize(dpfp(model.query_proj(model.embed(queries)), 1))[:, None]
    beta = torch.sigmoid(model.beta_proj(x))[..., 0][:, None]  # [3, 1, L]
    alpha = torch.sigmoid(model.alpha_proj(x))[..., 0][:, None]
    v = torch.nn.functional.one_hot(values, 6).double()[:, None]
    _, W = naive_gated_delta(phi_k, phi_k, v, beta, alpha, None, True)
    torch.testing.assert_close(model(keys, values, queries), (phi_q @ W)[:, 0])
    assert alpha.min() > 0.9 and alpha.mean() > 0.98  # the gate starts near 1: sigmoid(5 + w.x)



def test_gated_delta_rule_learns_to_overwrite_setting2():
    torch.manual_seed(0)
    model = RetrievalMemory(8, "dpfp", "gated_delta", arg=1)
    result = train(model, 8, 16, True, TrainConfig(max_steps=250, eval_every=50, seed=0))
    assert result["best_eval_loss"] < 0.05, result["curve"]
