"""The `transformer_lm_fw` model: fairseq's Transformer language model with fast-weight attention.

Only the build hooks of fairseq's `TransformerLanguageModel` are overridden: the decoder is the
translation model's `FastWeightTransformerDecoder` without cross-attention. Architectures set
their sizes with getattr, call the stock `transformer_lm` architecture and fill the `--fw-*`
options from the lm preset; build_model reads them once into a FastWeightConfig.

Carrying the fast-weight state across segments (paper §6.3, Table 4, "without truncating
context"): `model(src_tokens, fw_state=CarriedState())` starts every layer's fast weights from
the state the previous segment left in `fw_state` and leaves its own final state there,
detached, so backpropagation stays within the segment. The `fw_lm_stream --fw-carry-state` task
(fw_fairseq/tasks/) feeds segments in stream order and owns the `CarriedState` of each split.
"""
from typing import Dict, Optional

from torch import Tensor

from fairseq import options
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer_lm import (DEFAULT_MAX_TARGET_POSITIONS, TransformerLanguageModel,
                                           TransformerLanguageModelConfig, base_lm_architecture)
from fairseq.modules import AdaptiveInput, CharacterTokenEmbedder

from fw_fairseq.models.checkpoints import RecordsFastWeightSettings
from fw_fairseq.models.transformer_fw import FastWeightTransformerDecoder
from fw_fairseq.modules.fast_weight_config import (FastWeightConfig, add_fast_weight_args, check_fast_weight_args,
                                                   set_fast_weight_defaults)


class CarriedState:
    """The fast-weight state of B parallel text streams between consecutive segments.

    Deliberately not a dict: fairseq's `move_to_cuda`/`apply_to_sample` rebuild dicts inside a
    sample, which would silently drop the state written back by the model.
    """

    def __init__(self):
        self.incremental_state: Dict[str, Dict[str, Optional[Tensor]]] = {}

    def reset(self):
        self.incremental_state = {}

    def detach_(self):
        """Truncated backprop: the next segment starts from these values, not their history."""
        for buffer in self.incremental_state.values():
            for name, tensor in buffer.items():
                if tensor is not None:
                    buffer[name] = tensor.detach()


class FastWeightLMDecoder(FastWeightTransformerDecoder):
    def forward_segment(self, tokens: Tensor, state: CarriedState):
        """Logits [B, T, V] of a whole segment `tokens` [B, T] whose layers start from `state`.

        fairseq's decoder, given an incremental_state, keeps only the last token (generation);
        here the whole segment runs at once and every FastWeightAttention reads its initial
        (W, z) from the state's buffer and writes its final one back.
        """
        if self.embed_positions is not None:
            raise ValueError("--fw-carry-state needs --no-token-positional-embeddings (or "
                             "--fw-decoder-positions none): absolute positions would restart at every "
                             "segment of an unbroken stream (the paper's Table 4 model uses no positional "
                             "encoding)")
        if tokens.eq(self.padding_idx).any():
            raise ValueError("carried-state segments must not contain padding")
        x = self.embed_scale * self.embed_tokens(tokens)
        if self.quant_noise is not None:
            x = self.quant_noise(x)
        if self.project_in_dim is not None:
            x = self.project_in_dim(x)
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.dropout_module(x).transpose(0, 1)  # [T, B, C]
        for layer in self.layers:
            x, _, _ = layer(x, None, None, state.incremental_state)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = x.transpose(0, 1)  # [B, T, C]
        if self.project_out_dim is not None:
            x = self.project_out_dim(x)
        state.detach_()
        return self.output_layer(x), {"attn": [None], "inner_states": None}


@register_model("transformer_lm_fw")
class FastWeightTransformerLanguageModel(RecordsFastWeightSettings, TransformerLanguageModel):
    """Decoder-only Transformer whose self-attention layers are fast weight programmers."""

    carries_fw_state = True  # the fw_lm_stream task checks this before passing fw_state

    @classmethod
    def add_args(cls, parser):
        # Registered without a dataclass (so the --fw-* flags reach build_model through the
        # namespace); the stock LM options come from fairseq's own dataclass.
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_fast_weight_args(parser)

    @classmethod
    def build_model(cls, args, task):
        transformer_lm_fw(args)  # fill options missing from older checkpoints
        config = FastWeightConfig.from_args(args)  # the one parse of the --fw-* args, before any layer is built
        settings = config.settings()
        if args.decoder_layers_to_keep:
            args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
        if getattr(args, "max_target_positions", None) is None:
            args.max_target_positions = getattr(args, "tokens_per_sample", DEFAULT_MAX_TARGET_POSITIONS)
        embed_tokens = cls.build_embed_tokens(args, task)
        decoder = FastWeightLMDecoder(args, config, task.target_dictionary, embed_tokens, no_encoder_attn=True)
        model = cls(decoder)
        model.record_fast_weight_settings(settings)
        model.fw_config = config  # asked at every carried-state forward
        return model

    @classmethod
    def build_embed_tokens(cls, args, task):
        """The input embedding, chosen exactly as fairseq's TransformerLanguageModel does."""
        if args.character_embeddings:
            return CharacterTokenEmbedder(task.source_dictionary, eval(args.character_filters),
                                          args.character_embedding_dim, args.decoder_embed_dim,
                                          args.char_embedder_highway_layers)
        if args.adaptive_input:
            if args.tie_adaptive_weights and (
                    args.adaptive_input_factor != args.adaptive_softmax_factor
                    or args.adaptive_softmax_cutoff != args.adaptive_input_cutoff):
                raise ValueError("--tie-adaptive-weights needs equal adaptive input/softmax "
                                 "factors and cutoffs")
            return AdaptiveInput(len(task.source_dictionary), task.source_dictionary.pad(),
                                 args.decoder_input_dim, args.adaptive_input_factor,
                                 args.decoder_embed_dim,
                                 options.eval_str_list(args.adaptive_input_cutoff, type=int),
                                 args.quant_noise_pq, args.quant_noise_pq_block_size)
        return cls.build_embedding(args, task.source_dictionary, args.decoder_input_dim)

    def forward(self, src_tokens, src_lengths=None, fw_state: Optional[CarriedState] = None,
                **kwargs):
        """Without `fw_state`: fairseq's forward (every segment starts from empty fast weights)."""
        if fw_state is None:
            return self.decoder(src_tokens, src_lengths=src_lengths, **kwargs)
        if self.training and self.fw_config.redraws_features:
            raise ValueError("--fw-carry-state with --fw-feature-map favor: FAVOR+ redraws its "
                             "random features at every training forward, so a carried state "
                             "would mix feature spaces; use --fw-favor-redraw never or another map")
        return self.decoder.forward_segment(src_tokens, fw_state)


@register_model_architecture("transformer_lm_fw", "transformer_lm_fw")
def transformer_lm_fw(args):
    """fairseq's transformer_lm (6 layers, 512 dim, 8 heads: d_key 64) with the lm preset's fast weights: the
    DPFP-2 delta rule with the paper's LM recipe, sum-normalised phi (§4.2, its Table 3)."""
    base_lm_architecture(args)
    # architectures run while fairseq parses the arguments: errors stop there
    decoder = ((args.decoder_embed_dim, "--decoder-embed-dim"),
               (args.decoder_attention_heads, "--decoder-attention-heads"))
    layers = (args.decoder_layers, "--decoder-layers")
    set_fast_weight_defaults(args, "lm")
    check_fast_weight_args(args, {"decoder": decoder}, {"decoder": layers})


@register_model_architecture("transformer_lm_fw", "transformer_lm_fw_wt103_small")
def transformer_lm_fw_wt103_small(args):
    """The paper's small WikiText-103 Delta Network (§6.3, Table 2): 16 layers, D=128, 8 heads
    (d_key 16), FFN 2048, dropout 0.1, trained and evaluated on L=256 tokens
    (`--tokens-per-sample 256`). Table 2 linearises with the Linear Transformer's ELU+1
    (d_dot = d_key = 16) and the delta rule, with absolute positions and no attention
    normalisation (Table 3's row that repeats Table 2's numbers); Table 5 uses
    `--fw-feature-map dpfp --fw-dpfp-nu 1`.
    """
    args.decoder_layers = getattr(args, "decoder_layers", 16)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 128)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 8)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 2048)
    args.dropout = getattr(args, "dropout", 0.1)
    args.fw_feature_map = getattr(args, "fw_feature_map", None) or "elu"
    args.fw_dpfp_nu = getattr(args, "fw_dpfp_nu", None) or 1
    transformer_lm_fw(args)


@register_model_architecture("transformer_lm_fw", "transformer_lm_fw_tiny")
def transformer_lm_fw_tiny(args):
    """For CPU demos and tests: 2 layers, 64 dim, 4 heads (d_key 16), FFN 256, DPFP-1 delta."""
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 64)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 256)
    args.fw_dpfp_nu = getattr(args, "fw_dpfp_nu", None) or 1
    transformer_lm_fw(args)
