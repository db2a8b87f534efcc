"""Memory models for associative retrieval (paper §6.1), built on the plugin's own ops.

Every model embeds the L writes as x = [e(key); v] with v the fixed one-hot value in R^S, makes the
written key k = W_K x and the query q = W_Q e(query), writes all L pairs into a memory and reads
v_hat [S] for each query. Only how the memory is written and read differs:

  softmax          softmax attention over the L written keys (no fast weights; the upper bound)
  sum    (§3.2)    W = sum phi(k) v^T, z = sum phi(k); v_hat = W^T phi(q) / (z . phi(q))
  delta  ("ours")  phi' = phi / sum(phi); beta = sigmoid(W_beta x); delta-rule writes of (phi'(k), v);
                   v_hat = W^T phi'(q)
  gated_delta      the delta rule with a decay alpha = sigmoid(W_alpha x + b) per write (Gated DeltaNet,
                   Yang et al. 2024; beyond the paper), b initialised so that alpha starts near 1
  schlag (2021)    the same delta-rule write with phi(k) un-normalised (tanh or DPFP), the fast weight
                   rescaled to Frobenius norm <= 1 after every write, v_hat = LayerNorm(W^T phi(q))

The authors' code (github.com/ischlag/fast-weight-transformers, synthetic/) fixes what the paper
leaves open; we follow it: d_key = 64, d_emb = 1.1 * 2S, biases in W_K, W_Q, W_beta, and their inits.
The fast-weight maps and rules are the ops' own (fw_fairseq.ops.feature_map and the rule table
fw_fairseq.ops.RULES: sum normalisation, the z column and its eps, the per-write scalars); this task
adds only softmax attention, the tanh map and Schlag et al.'s norm-bounded write.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from fw_fairseq.ops import (
    FEATURE_MAPS as OPS_FEATURE_MAPS,
    RULES as OPS_RULES,
    append_z_column,
    divide_by_z,
    UpdateRule,
    fast_weight_delta,
    fast_weight_read,
    feature_map as build_feature_map,
    sum_normalize,
)

FEATURE_MAPS = ("softmax", *OPS_FEATURE_MAPS, "tanh")
# alpha = sigmoid(W_alpha x + b) starts at sigmoid(5) = 0.993: a memory of L = 40 writes keeps 0.76 of
# its first write, so training starts near the delta rule and learns how much to forget.
_GATE_BIAS_INIT = 5.0


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
            raise ValueError(f"rule={rule!r}; allowed: {', '.join(RULES)}")
        self.num_symbols, self.feature_map, self.rule, self.arg = num_symbols, feature_map, rule, arg
        self.d_key = d_key
        d_emb = int(2 * num_symbols * 1.1)
        self.embed = nn.Embedding(num_symbols, d_emb)  # e(.) for written and queried keys alike
        self.key_proj = nn.Linear(d_emb + num_symbols, d_key)  # W_K [e(k); v]
        self.query_proj = nn.Linear(d_emb, d_key)  # W_Q e(q)
        scalars = () if feature_map == "softmax" else RULES[rule].scalars
        self.beta_proj = nn.Linear(d_emb + num_symbols, 1) if "beta" in scalars else None
        # None for softmax and tanh. FAVOR+ draws its projection from the global RNG, here, between the
        # projections and the inits below: the order the recorded results were seeded with.
        self.phi_map = (build_feature_map(feature_map, d_key, nu=arg, m=arg)
                        if feature_map in OPS_FEATURE_MAPS else None)
        self.alpha_proj = nn.Linear(d_emb + num_symbols, 1) if "alpha" in scalars else None
        if self.alpha_proj is not None:
            nn.init.constant_(self.alpha_proj.bias, _GATE_BIAS_INIT)
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
        if self.phi_map is not None:
            return self.phi_map.out_dim
        return self.d_key if self.feature_map == "tanh" else None

    def phi(self, x, is_query):
        return torch.tanh(x) if self.phi_map is None else self.phi_map(x, is_query)

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
        if self.training and self.phi_map is not None:
            self.phi_map.redraw()  # FAVOR+ (paper §5.3): new random features per mini-batch, fixed in eval
        # the ops are head-first: one head, H = 1
        phi_k = self.phi(k, is_query=False)[:, None]  # [B, 1, L, E]
        phi_q = self.phi(q, is_query=True)[:, None]  # [B, 1, Q, E]
        v = v[:, None]  # [B, 1, L, S]
        projections = {"beta": self.beta_proj, "alpha": self.alpha_proj}
        scalars = {name: torch.sigmoid(self._project_writes(proj, keys, values)).transpose(1, 2)  # [B, 1, L]
                   for name, proj in projections.items() if proj is not None}
        rule = RULES[self.rule]
        if rule.normalised_phi:  # the paper's sum normalisation (§4.2)
            phi_k, phi_q = sum_normalize(phi_k), sum_normalize(phi_q)
        if rule.z_column:  # the memory's last column is z = sum phi(k) (Eq. 18): [B, 1, L, S + 1]
            v = append_z_column(v)
        read = fast_weight_read(phi_q, rule.write(phi_k, v, *(scalars[name] for name in rule.scalars)))
        if rule is SCHLAG:  # Schlag et al. layer-normalise their memory's read
            read = F.layer_norm(read, (S,))
        return (divide_by_z(read) if rule.z_column else read)[:, 0]  # [B, Q, S]


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


# The task's own rule beside the ops' table: a memory (the write) and nothing else, which the module reads like
# the others' (UpdateRule.write) and layer-normalises
SCHLAG = UpdateRule(name="schlag", scalars=("beta",), pad_values={"beta": 0.0}, memory=schlag_write)
RULES = {**OPS_RULES, SCHLAG.name: SCHLAG}
