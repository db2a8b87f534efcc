"""A Feedback Transformer layer and the layer mix that writes the shared memory."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fw_fairseq.baselines.feedback_attention import FeedbackAttention


class FeedbackLayer(nn.Module):
    """Pre-norm layer for one step: x += attn(LN(x), memory); x += FFN(LN(x))."""

    def __init__(self, embed_dim: int, num_heads: int, ffn_dim: int, max_distance: int,
                 dropout: float, attention_dropout: float, activation_dropout: float):
        super().__init__()
        self.attn = FeedbackAttention(embed_dim, num_heads, max_distance, attention_dropout)
        self.attn_norm = nn.LayerNorm(embed_dim)
        self.ffn_norm = nn.LayerNorm(embed_dim)
        self.fc1 = nn.Linear(embed_dim, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, embed_dim)
        self.dropout = dropout
        self.activation_dropout = activation_dropout

    def forward(self, x: Tensor, keys: Optional[Tensor], values: Optional[Tensor]) -> Tensor:
        """x [B, C]; keys/values [B, H, S, D] of the past memories, None at the first step."""
        if keys is not None:
            x = x + F.dropout(self.attn(self.attn_norm(x), keys, values), self.dropout,
                              self.training)
        h = F.dropout(F.relu(self.fc1(self.ffn_norm(x))), self.activation_dropout, self.training)
        return x + F.dropout(self.fc2(h), self.dropout, self.training)


class FeedbackMemoryMix(nn.Module):
    """m_t = sum_l softmax(w)_l h_t^l over the embedding (l = 0) and every layer's output."""

    def __init__(self, num_layers: int):
        super().__init__()
        self.weights = nn.Parameter(torch.ones(num_layers + 1))

    def forward(self, layer_outputs) -> Tensor:
        """layer_outputs: L+1 tensors [B, C] -> [B, C]."""
        stacked = torch.stack(list(layer_outputs), dim=0)  # [L+1, B, C]
        mix = torch.softmax(self.weights, dim=0).to(stacked.dtype)
        return torch.einsum("lbc,l->bc", stacked, mix)
