"""`feedback_transformer_lm`: the Feedback Transformer language model (Fan et al., 2020).

At step t every layer attends to the same memory of past steps m_0..m_{t-1}, where m_s is a
learned softmax-weighted sum of the embedding and all layers' outputs at step s. Step t's
memory depends on step t's top layer, so steps run one after another in training too (the
recurrence is real: ~T times more sequential work than a parallel Transformer); the embedding
and the output projection run on the whole sequence at once.

Generation caches every layer's keys/values of the memory in fairseq's `incremental_state`
([B, L, H, S, D], batch on dim 0), so each new token costs one step.
"""
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fairseq.models import (FairseqIncrementalDecoder, FairseqLanguageModel, register_model,
                            register_model_architecture)
from fairseq.models.transformer import Embedding

from fw_fairseq.baselines.feedback_layer import FeedbackLayer, FeedbackMemoryMix

DEFAULT_MAX_POSITIONS = 1024


class FeedbackTransformerDecoder(FairseqIncrementalDecoder):
    def __init__(self, args, dictionary, embed_tokens):
        super().__init__(dictionary)
        self.embed_dim = args.decoder_embed_dim
        self.padding_idx = dictionary.pad()
        self.max_target_positions = args.max_target_positions
        self.embed_tokens = embed_tokens
        self.embed_scale = 1.0 if args.no_scale_embedding else self.embed_dim ** 0.5
        self.dropout = args.dropout
        self.layers = nn.ModuleList([
            FeedbackLayer(self.embed_dim, args.decoder_attention_heads, args.decoder_ffn_embed_dim,
                          args.max_target_positions, args.dropout, args.attention_dropout,
                          args.activation_dropout)
            for _ in range(args.decoder_layers)])
        self.memory_mix = FeedbackMemoryMix(args.decoder_layers)
        self.layer_norm = nn.LayerNorm(self.embed_dim)
        self.output_projection = nn.Linear(self.embed_dim, len(dictionary), bias=False)
        if args.share_decoder_input_output_embed:
            self.output_projection.weight = embed_tokens.weight
        else:
            nn.init.normal_(self.output_projection.weight, mean=0, std=self.embed_dim ** -0.5)

    def forward(self, prev_output_tokens: Tensor, encoder_out=None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                features_only: bool = False, src_lengths=None, **kwargs):
        """Tokens [B, T] -> (logits [B, T', V], extra); T' = the steps not yet in the cache."""
        x, extra = self.extract_features(prev_output_tokens, incremental_state)
        return (x if features_only else self.output_layer(x)), extra

    def extract_features(self, prev_output_tokens: Tensor,
                         incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                         **kwargs):
        cache = self._get_cache(incremental_state)
        done = cache["keys"].size(3) if cache else 0
        tokens = prev_output_tokens[:, done:]
        if incremental_state is None and tokens[:, 0].eq(self.padding_idx).any():
            raise ValueError("feedback_transformer_lm needs right-padded inputs: left padding "
                             "would enter the memory of the following steps")
        x = F.dropout(self.embed_scale * self.embed_tokens(tokens), self.dropout, self.training)
        keys = cache["keys"] if cache else None  # [B, L, H, S, D]
        values = cache["values"] if cache else None
        new_keys, new_values, outputs, memories = [], [], [], []
        for h in x.unbind(dim=1):  # one step at a time: [B, C]
            layer_outputs = [h]
            for i, layer in enumerate(self.layers):
                h = layer(h, keys[:, i] if keys is not None else None,
                          values[:, i] if values is not None else None)
                layer_outputs.append(h)
            memory = self.memory_mix(layer_outputs)  # [B, C]
            step_kv = [layer.attn.project_memory(memory) for layer in self.layers]
            new_keys.append(torch.stack([k for k, _ in step_kv], dim=1))  # [B, L, H, D]
            new_values.append(torch.stack([v for _, v in step_kv], dim=1))
            keys, values = self._extend(keys, values, new_keys[-1:], new_values[-1:])
            outputs.append(h)
            memories.append(memory)
        if incremental_state is not None:
            self._set_cache(incremental_state, {"keys": keys, "values": values})
        features = self.layer_norm(torch.stack(outputs, dim=1))  # [B, T', C]
        return features, {"attn": [None], "inner_states": None,
                          "memory": torch.stack(memories, dim=1)}  # memory: [B, T', C]

    @staticmethod
    def _extend(keys, values, new_keys: List[Tensor], new_values: List[Tensor]):
        """Append steps' [B, L, H, D] keys/values on the memory axis: -> [B, L, H, S+n, D]."""
        k, v = torch.stack(new_keys, dim=3), torch.stack(new_values, dim=3)
        if keys is None:
            return k, v
        return torch.cat([keys, k], dim=3), torch.cat([values, v], dim=3)

    def output_layer(self, features: Tensor) -> Tensor:
        return self.output_projection(features)

    def max_positions(self):
        return self.max_target_positions

    def _get_cache(self, incremental_state):
        if incremental_state is None:
            return None
        return self.get_incremental_state(incremental_state, "feedback_memory")

    def _set_cache(self, incremental_state, cache):
        self.set_incremental_state(incremental_state, "feedback_memory", cache)

    def reorder_incremental_state(self, incremental_state, new_order: Tensor):
        """Beam search reorders (and prunes) hypotheses: batch is dim 0 of the cache."""
        cache = self._get_cache(incremental_state)
        if cache:
            self._set_cache(incremental_state, {name: tensor.index_select(0, new_order)
                                                for name, tensor in cache.items()})


@register_model("feedback_transformer_lm")
class FeedbackTransformerLanguageModel(FairseqLanguageModel):
    """Decoder-only Feedback Transformer; works with fairseq's LM task, eval-lm and generation."""

    @staticmethod
    def add_args(parser):
        parser.add_argument("--decoder-embed-dim", type=int, metavar="N")
        parser.add_argument("--decoder-ffn-embed-dim", type=int, metavar="N")
        parser.add_argument("--decoder-layers", type=int, metavar="N")
        parser.add_argument("--decoder-attention-heads", type=int, metavar="N")
        parser.add_argument("--dropout", type=float, metavar="D")
        parser.add_argument("--attention-dropout", type=float, metavar="D")
        parser.add_argument("--activation-dropout", type=float, metavar="D")
        parser.add_argument("--share-decoder-input-output-embed", action="store_true",
                            help="tie the input embedding and output projection")
        parser.add_argument("--no-scale-embedding", action="store_true",
                            help="do not scale embeddings by sqrt(embed_dim)")

    @classmethod
    def build_model(cls, args, task):
        feedback_transformer_lm(args)  # fill options missing from older checkpoints
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample", DEFAULT_MAX_POSITIONS)
        dictionary = task.target_dictionary
        embed_tokens = Embedding(len(dictionary), args.decoder_embed_dim, dictionary.pad())
        return cls(FeedbackTransformerDecoder(args, dictionary, embed_tokens))


@register_model_architecture("feedback_transformer_lm", "feedback_transformer_lm")
def feedback_transformer_lm(args):
    """fairseq transformer_lm's sizes: 6 layers, 512 dim, 8 heads, FFN 2048, dropout 0.1."""
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", None) or 512
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", None) or 2048
    args.decoder_layers = getattr(args, "decoder_layers", None) or 6
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", None) or 8
    args.dropout = getattr(args, "dropout", 0.1)
    args.attention_dropout = getattr(args, "attention_dropout", None) or 0.0
    args.activation_dropout = getattr(args, "activation_dropout", None) or 0.0
    args.share_decoder_input_output_embed = bool(
        getattr(args, "share_decoder_input_output_embed", False))
    args.no_scale_embedding = bool(getattr(args, "no_scale_embedding", False))


@register_model_architecture("feedback_transformer_lm", "feedback_transformer_lm_tiny")
def feedback_transformer_lm_tiny(args):
    """For CPU demos and tests: 2 layers, 64 dim, 4 heads, FFN 256."""
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", None) or 64
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", None) or 256
    args.decoder_layers = getattr(args, "decoder_layers", None) or 2
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", None) or 4
    feedback_transformer_lm(args)
