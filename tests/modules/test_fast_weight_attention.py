"""FastWeightAttention alone (float64): it computes the function its docstring states, on each of
its three paths, for every rule, beta max and padding; its caches equal recomputation."""
import itertools
import math

import pytest
import torch

from factories import randomize_scalar_projections
from fw_fairseq.modules import FastWeightAttention, FastWeightConfig
from fw_fairseq.modules.flag_table import GATE_BIAS_INIT
from fw_fairseq.ops import RULES, dpfp, elu_plus_one

C, H = 12, 2  # d_key 6
PATHS = {"encoder": dict(causal=False), "causal": dict(causal=True),
         "cross": dict(causal=False, kdim=10, vdim=10, encoder_decoder_attention=True)}
# every rule, and the delta rules with beta in (0, 1), (0, 2) and (0, 0.1)
RULE_BETA = [(rule, beta_max) for rule in RULES
             for beta_max in ((1, 2, 0.1) if "beta" in RULES[rule].scalars else (1,))]


def attention(path, rule, feature_map="dpfp", beta_max=1, seed=0, delta_norm="sum"):
    torch.manual_seed(seed)
    config = FastWeightConfig(feature_map, rule, 2, 8, frozenset(), beta_max, delta_norm=delta_norm)
    attn = FastWeightAttention(C, H, config, **PATHS[path]).double().eval()
    return randomize_scalar_projections(attn, torch.Generator().manual_seed(seed))


def reference(attn, query, key, pad, causal, delta_norm="sum"):
    """The docstring's function, one position at a time: query [T, B, C], key [S, B, C], pad [B, S]
    -> [T, B, C]. A causal query t reads the memory after writes 1..t, others the whole memory."""
    (T, B, _), S = query.shape, key.size(0)
    d = attn.head_dim
    maps = {"elu": lambda x, _: elu_plus_one(x), "dpfp": lambda x, _: dpfp(x, 2),
            "favor": lambda x, is_query: favor(attn.phi, x, is_query)}
    phi = maps[attn.feature_map]
    q = phi(attn.q_proj(query).view(T, B, H, d), True)  # [T, B, H, E]
    k = phi(attn.k_proj(key).view(S, B, H, d), False)  # [S, B, H, E]
    v = attn.v_proj(key).view(S, B, H, d)
    rule, keep = attn.update_rule, (~pad).T.double()  # [S, B]
    if rule != "sum":  # --fw-delta-norm
        norm = (lambda x: x.sum(-1, keepdim=True)) if delta_norm == "sum" else (lambda x: x.norm(dim=-1, keepdim=True))
        q, k = q / norm(q), k / norm(k)
    ones = torch.ones(S, B, H, dtype=torch.float64)
    beta = attn.beta_max * torch.sigmoid(attn.beta_proj(key)) if rule != "sum" else ones
    alpha = torch.sigmoid(attn.alpha_proj(key)) if rule == "gated_delta" else ones
    W, memories = torch.zeros(B, H, k.size(-1), d, dtype=torch.float64), []
    z = torch.zeros(B, H, k.size(-1), dtype=torch.float64)  # the z column's memory (sum, delta_z)
    for s in range(S):
        ks, live = k[s] * keep[s, :, None, None], keep[s, :, None]  # [B, H, E], [B, 1]
        if rule == "sum":
            W, z = W + ks[..., None] * v[s][..., None, :], z + ks
        else:  # at a padded position alpha is 1 and beta 0: nothing decays, nothing is written
            W = (alpha[s] * live + 1 - live)[..., None, None] * W
            u = beta[s][..., None] * live[..., None] * (v[s] - torch.einsum("bhe,bhed->bhd", ks, W))
            W = W + ks[..., None] * u[..., None, :]
            if rule == "delta_z":  # z is the delta rule's memory of a constant 1: z += beta phi(k) (1 - z . phi(k))
                z = z + ks * (beta[s] * live * (1 - (ks * z).sum(-1)))[..., None]
        memories.append((W, z))
    out = []
    for t in range(T):
        W, z = memories[t if causal else -1]
        y = torch.einsum("bhe,bhed->bhd", q[t], W)  # [B, H, d]
        if rule in ("sum", "delta_z"):
            y = y / ((q[t] * z).sum(-1, keepdim=True) + 1e-6)
        out.append(y.reshape(B, C))
    return attn.out_proj(torch.stack(out))


def favor(phi, x, is_query):
    """FAVOR+ as its docstring states it, of the heads x [..., d] -> [..., 2m] with its projection; a query's
    exponents shifted by their maximum (the sum rule's eps sees it)."""
    xs = x * x.shape[-1] ** -0.25
    u, half = xs @ phi.projection.double().T, xs.pow(2).sum(-1, keepdim=True) / 2  # [..., m], [..., 1]
    e = torch.cat([u - half, -u - half], dim=-1)  # [..., 2m]
    return torch.exp(e - e.amax(-1, keepdim=True) if is_query else e) / math.sqrt(2 * u.shape[-1])


def inputs(path, T=5, S=7, B=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    query = torch.randn(T, B, C, generator=g, dtype=torch.float64)
    if path != "cross":
        return query, query, torch.zeros(B, T, dtype=torch.bool)
    key = torch.randn(S, B, 10, generator=g, dtype=torch.float64)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, :3], pad[2, :1] = True, True  # fairseq pads sources on the left
    return query, key, pad


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("rule,beta_max", RULE_BETA)
@pytest.mark.parametrize("feature_map,delta_norm", [("elu", "sum"), ("dpfp", "sum"), ("dpfp", "l2"), ("favor", "sum")])
def test_module_computes_its_documented_function(path, rule, beta_max, feature_map, delta_norm):
    attn = attention(path, rule, feature_map, beta_max, delta_norm=delta_norm)
    query, key, pad = inputs(path)
    if path == "encoder":
        pad[1, :2] = True
    out, weights = attn(query, key, key, key_padding_mask=pad if pad.any() else None)
    expected = reference(attn, query, key, pad, causal=path == "causal", delta_norm=delta_norm)
    assert weights is None
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rule,beta_max", RULE_BETA)
@pytest.mark.parametrize("feature_map", ["elu", "dpfp", "favor"])
def test_causal_steps_equal_the_whole_sequence(rule, beta_max, feature_map):
    attn = attention("causal", rule, feature_map, beta_max)
    x, _, _ = inputs("causal", T=6)
    state = {}
    steps = [attn(xt, xt, xt, incremental_state=state)[0] for xt in x.split(1)]
    torch.testing.assert_close(torch.cat(steps), attn(x, x, x)[0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("rule", RULES)
def test_cross_attention_cache_equals_recomputation(rule):
    attn = attention("cross", rule)
    queries, memory_in, pad = inputs("cross", T=3)
    state = {}
    cached = [attn(queries[t: t + 1], memory_in, memory_in, key_padding_mask=pad,
                   incremental_state=state, static_kv=True)[0] for t in range(3)]
    recomputed, _ = attn(queries, memory_in, memory_in, key_padding_mask=pad, static_kv=True)
    assert "memory" in attn._get_input_buffer(state)
    torch.testing.assert_close(torch.cat(cached), recomputed, rtol=1e-10, atol=1e-10)


def test_parameters_per_rule_and_the_gate_starts_near_one():
    names = {rule: {n for n, _ in attention("encoder", rule, "favor").named_parameters()}
             | set(dict(attention("encoder", rule, "favor").named_buffers()))
             for rule in RULES}
    common = {f"{p}_proj.{w}" for p, w in itertools.product("qkv", ("weight", "bias"))}
    common |= {"out_proj.weight", "out_proj.bias", "favor.projection"}
    assert names["sum"] == common
    assert names["delta"] == common | {"beta_proj.weight", "beta_proj.bias"}
    assert names["gated_delta"] == names["delta"] | {"alpha_proj.weight", "alpha_proj.bias"}
    torch.manual_seed(0)
    gated = FastWeightAttention(C, H, FastWeightConfig("elu", "gated_delta", 2, 8, frozenset()), causal=True)
    assert torch.all(gated.alpha_proj.bias == GATE_BIAS_INIT)
    x = torch.randn(4, 2, C)
    alpha = torch.sigmoid(gated.alpha_proj(x))
    assert alpha.min() > 0.95  # near the delta rule at the start of training


def test_each_block_takes_its_own_rule_and_the_beta_bias():
    config = FastWeightConfig("elu", "sum", 2, 8, frozenset(), block_rules=(("decoder", "delta"),),
                              beta_bias=2.0)
    blocks = {path: FastWeightAttention(C, H, config, **PATHS[path]) for path in PATHS}
    assert {path: attn.update_rule for path, attn in blocks.items()} == {
        "encoder": "sum", "causal": "delta", "cross": "sum"}
    assert torch.all(blocks["causal"].beta_proj.bias == 2.0)  # beta starts at sigmoid(2) = 0.88


@pytest.mark.parametrize("call,message", [
    (dict(before_softmax=True), "pre-softmax"),
    (dict(attn_mask=torch.zeros(5, 5)), "attn_mask"),
    (dict(value=torch.zeros(5, 3, C)), "same tensor"),
])
def test_refusals(call, message):
    attn = attention("encoder", "sum")
    x = torch.zeros(5, 3, C, dtype=torch.float64)
    with pytest.raises(ValueError, match=message):
        attn(x, x, call.pop("value", x), **call)
