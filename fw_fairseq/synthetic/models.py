"""Memory models for associative retrieval (paper §6.1), built on the plugin's own ops.

Every model embeds the L writes as x = [e(key); v] with v the fixed one-hot value in R^S, makes the
written key k = W_K x and the query q = W_Q e(query), writes all L pairs into a memory and reads
v_hat [S] for each query. Only how the memory is written and read differs:

  softmax          softmax attention over the L written keys (no fast weights; the upper bound)
  sum    (§3.2)    W = sum phi(k) v^T, z = sum phi(k); v_hat = W^T phi(q) / (z . phi(q))
  delta  ("ours")  phi' = phi / sum(phi); beta = sigmoid(W_beta x); delta-rule writes of (phi'(k), v);
                   v_hat = W^T phi'(q)
  schlag (2021)    the same delta-rule write with phi(k) un-normalised (tanh or DPFP), the fast weight
                   rescaled to Frobenius norm <= 1 after every write, v_hat = LayerNorm(W^T phi(q))

The authors' code (github.com/ischlag/fast-weight-transformers, synthetic/) fixes what the paper
leaves open; we follow it: d_key = 64, d_emb = 1.1 * 2S, biases in W_K, W_Q, W_beta, and their inits.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from fw_fairseq.ops import (
    FavorPlus,
    dpfp,
    elu_plus_one,
    fast_weight_delta,
    fast_weight_read,
    fast_weight_write,
    sum_normalize,
)

FEATURE_MAPS = ("softmax", "elu", "favor", "dpfp", "tanh")
RULES = ("sum", "delta", "schlag")
_EPS = 1e-6  # denominator guard of the sum rule's z . phi(q), as in the authors' code


class RetrievalMemory(nn.Module):
    """keys, values [B, L] and queries [B, Q] (symbols 0..S-1) -> v_hat [B, Q, S].

    feature_map: one of FEATURE_MAPS; `arg` is nu for dpfp and m (random features) for favor.
    rule: one of RULES ('softmax' ignores it).
    """

    def __init__(self, num_symbols, feature_map, rule="sum", arg=None, d_key=64):
        super().__init__()
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map={feature_map!r}; allowed: {FEATURE_MAPS}")
        if rule not in RULES:
            raise ValueError(f"rule={rule!r}; allowed: {RULES}")
        self.num_symbols, self.feature_map, self.rule, self.arg = num_symbols, feature_map, rule, arg
        self.d_key = d_key
        d_emb = int(2 * num_symbols * 1.1)
        self.embed = nn.Embedding(num_symbols, d_emb)  # e(.) for written and queried keys alike
        self.key_proj = nn.Linear(d_emb + num_symbols, d_key)  # W_K [e(k); v]
        self.query_proj = nn.Linear(d_emb, d_key)  # W_Q e(q)
        uses_beta = feature_map != "softmax" and rule != "sum"
        self.beta_proj = nn.Linear(d_emb + num_symbols, 1) if uses_beta else None
        self.favor = FavorPlus(d_key, arg) if feature_map == "favor" else None
        nn.init.normal_(self.embed.weight, std=1.0)
        if feature_map == "softmax":
            nn.init.xavier_uniform_(self.key_proj.weight)
            nn.init.xavier_uniform_(self.query_proj.weight)
        else:
            bound = 1 / math.sqrt(d_key)
            nn.init.uniform_(self.key_proj.weight, -bound, bound)
            nn.init.uniform_(self.query_proj.weight, -bound, bound)

    @property
    def d_dot(self):
        """Dimension E of phi's codomain: the capacity of the fast weight memory (paper §4.1)."""
        return {
            "softmax": None,
            "elu": self.d_key,
            "tanh": self.d_key,
            "favor": 2 * (self.arg or 0),
            "dpfp": 2 * self.d_key * (self.arg or 0),
        }[self.feature_map]

    def phi(self, x, is_query):
        if self.feature_map == "elu":
            return elu_plus_one(x)
        if self.feature_map == "dpfp":
            return dpfp(x, self.arg)
        if self.feature_map == "favor":
            return self.favor(x, is_query=is_query)
        return torch.tanh(x)

    def _project_writes(self, linear, keys, values):
        """linear([e(key); one_hot(value)]) for every write: [B, L] x 2 -> [B, L, out].

        The one-hot half of the input just selects a column of the weight, and e(key) is one of S
        rows, so projecting the S table rows once and gathering is the same function (and gradient)
        at O(S d_emb out) instead of O(B L (d_emb + S) out) per forward.
        """
        d_emb = self.embed.embedding_dim
        key_table = self.embed.weight @ linear.weight[:, :d_emb].T  # [S, out]
        value_table = linear.weight[:, d_emb:].T  # [S, out]
        return key_table[keys] + value_table[values] + linear.bias  # [B, L, out]

    def forward(self, keys, values, queries):
        S = self.num_symbols
        v = F.one_hot(values, S).to(self.embed.weight.dtype)  # [B, L, S]
        k = self._project_writes(self.key_proj, keys, values)  # [B, L, d_key] = W_K [e(k); v]
        q = self.query_proj(self.embed.weight)[queries]  # [B, Q, d_key] = W_Q e(q), via the [S, d_key] table
        if self.feature_map == "softmax":
            attn = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(self.d_key), dim=-1)  # [B, Q, L]
            return attn @ v  # [B, Q, S]
        if self.favor is not None and self.training:
            self.favor.redraw()  # paper §5.3: new random features per mini-batch, fixed in eval
        # the ops are head-first: one head, H = 1
        phi_k = self.phi(k, is_query=False)[:, None]  # [B, 1, L, E]
        phi_q = self.phi(q, is_query=True)[:, None]  # [B, 1, Q, E]
        v = v[:, None]  # [B, 1, L, S]
        if self.rule == "sum":
            # A constant 1 appended to every value makes the memory's last column z = sum phi(k)
            # (Eq. 18), so one write and one read give both the numerator and z . phi(q).
            v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)  # [B, 1, L, S + 1]
            read = fast_weight_read(phi_q, fast_weight_write(phi_k, v1))  # [B, 1, Q, S + 1]
            return (read[..., :S] / (read[..., S:] + _EPS))[:, 0]  # [B, Q, S]
        beta = torch.sigmoid(self._project_writes(self.beta_proj, keys, values)).transpose(1, 2)  # [B, 1, L]
        if self.rule == "delta":
            state = fast_weight_write(sum_normalize(phi_k), v, beta)  # [B, 1, E, S]
            return fast_weight_read(sum_normalize(phi_q), state)[:, 0]  # [B, Q, S]
        state = schlag_write(phi_k, v, beta)  # [B, 1, E, S]
        return F.layer_norm(fast_weight_read(phi_q, state), (S,))[:, 0]  # [B, Q, S]


def schlag_write(k, v, beta):
    """Fast weight memory write of Schlag et al. (2021), Eq. 24 plus their norm bound.

    Their step reads v_old = W^T k, removes v_old k^T and writes (beta v + (1 - beta) v_old) k^T, i.e.
    W + beta k (v - W^T k)^T: exactly the delta op with un-normalised keys. They then rescale
    W <- W / max(1, |W|_F). That factor depends on the state after each write, so the L writes cannot
    be one delta-op call; each write is one call with T = 1 that resumes from the rescaled state.
    (The authors' code skips the rescale after the very first write; we apply it after every write.)

    k: [B, H, L, E]; v: [B, H, L, M]; beta: [B, H, L] -> state [B, H, E, M].
    """
    state = None
    for t in range(k.shape[2]):
        k_t, v_t, beta_t = k[:, :, t : t + 1], v[:, :, t : t + 1], beta[:, :, t : t + 1]
        _, state = fast_weight_delta(k_t, k_t, v_t, beta_t, initial_state=state, output_final_state=True)
        norm = state.flatten(2).norm(dim=-1)  # [B, H]
        state = state / norm.clamp_min(1.0)[..., None, None]
    return state
