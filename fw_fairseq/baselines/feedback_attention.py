"""Feedback attention: one query step reads the memory of all past steps (Fan et al., 2020).

Memory vector m_s (s < t) is shared by all layers; each layer has its own key/value projections
of it, computed once when m_s is written (`project_memory`) and cached, so a step costs O(t).
Positions are relative: the key of m_s gets a learned embedding r_{t-s} of its distance and the
query a learned bias u, score(t, s) = (q_t + u)^T (k_s + r_{t-s}) / sqrt(d_head) (Transformer-XL
style; labml's annotated Feedback Transformer). Distances beyond `max_distance` share its
embedding, so generation may run past the training length.
"""
import math
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class FeedbackAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, max_distance: int, dropout: float = 0.0):
        super().__init__()
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim {embed_dim} must be divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.max_distance = max_distance
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # Row d-1 embeds distance d (1..max_distance); the newest memory is at distance 1.
        self.rel_key = nn.Parameter(torch.zeros(max_distance, num_heads, self.head_dim))
        self.query_bias = nn.Parameter(torch.zeros(num_heads, self.head_dim))
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=2 ** -0.5)
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def project_memory(self, memory: Tensor) -> Tuple[Tensor, Tensor]:
        """memory [B, C] -> this layer's key and value of it, [B, H, D] each."""
        bsz = memory.size(0)
        return (self.k_proj(memory).view(bsz, self.num_heads, self.head_dim),
                self.v_proj(memory).view(bsz, self.num_heads, self.head_dim))

    def relative_keys(self, num_memories: int) -> Tensor:
        """[H, S, D]: r_{t-s} for memories s = 0..S-1 read at step t = S (distances S..1)."""
        distance = torch.arange(num_memories, 0, -1, device=self.rel_key.device)
        return self.rel_key[distance.clamp(max=self.max_distance) - 1].transpose(0, 1)

    def forward(self, x: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """x [B, C] reads keys/values [B, H, S, D] of the S past memories -> [B, C]."""
        bsz = x.size(0)
        q = self.q_proj(x).view(bsz, self.num_heads, 1, self.head_dim) + self.query_bias[:, None]
        keys = keys + self.relative_keys(keys.size(2))  # [B, H, S, D]
        scores = q @ keys.transpose(2, 3) / math.sqrt(self.head_dim)  # [B, H, 1, S]
        probs = F.dropout(torch.softmax(scores, dim=-1), p=self.dropout, training=self.training)
        out = (probs @ values).view(bsz, -1)  # [B, H, 1, D] -> [B, C]
        return self.out_proj(out)
