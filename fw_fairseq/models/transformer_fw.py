"""The `transformer_fw` model: fairseq's Transformer with fast-weight attention.

Only fairseq's `build_*` hooks are overridden (the linformer plugin's pattern): layers are the
stock ones except that their attention comes from `FastWeightAttention` where `--fw-attention`
says so. Architectures call the stock architecture and then fill the `--fw-*` options from the translation preset
(fast_weight_config.set_fast_weight_defaults); build_model reads them once into a FastWeightConfig, which the encoder,
the decoder and each of their layers are built from.
"""
import logging

import numpy as np
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import (TransformerDecoder, TransformerEncoder, TransformerModel,
                                        base_architecture, transformer_vaswani_wmt_en_de_big)
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import (TransformerDecoderLayerBase,
                                               TransformerEncoderLayerBase)

from fw_fairseq.models.checkpoints import RecordsFastWeightSettings
from fw_fairseq.modules.aligned_softmax import AlignedMultiheadAttention
from fw_fairseq.modules.fast_weight_attention import FastWeightAttention
from fw_fairseq.modules.fast_weight_config import (FastWeightConfig, add_fast_weight_args, check_fast_weight_args,
                                                   set_fast_weight_defaults)
from fw_fairseq.modules.fast_weight_flags import ALIGN_RATIO_OF_DATA, cli_error

logger = logging.getLogger(__name__)
# The criteria the aligned read of the source was measured with: fw_unlikelihood for training,
# fw_attention_distillation for the distillation stage of a conversion (docs/long_outputs.md, docs/converting.md)
ALIGNED_READ_CRITERIA = ("fw_unlikelihood", "fw_attention_distillation")


def criterion_warning(args, config: FastWeightConfig):
    """One line for a run that trains the aligned read (--fw-cross-align P > 0) with another criterion, else None.
    fairseq takes the criterion from the command line only, so without this such a run silently trains another
    recipe than the measured one."""
    criterion = getattr(args, "criterion", None)
    if criterion is None or criterion in ALIGNED_READ_CRITERIA or not (config.uses("cross") and config.cross_align):
        return None
    return (f"--fw-cross-align {config.cross_align} was measured with --criterion fw_unlikelihood; this run trains "
            f"with --criterion {criterion}, and its long translations run to the length limit more often")


def _wrap_like_fairseq(layer, cfg):
    """Activation checkpointing and FSDP wrapping exactly as fairseq's build_*_layer do."""
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    min_params_to_wrap = cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0
    return fsdp_wrap(layer, min_num_params=min_params_to_wrap)


def _next_layer_config(stack, cfg, block: str) -> FastWeightConfig:
    """The fast-weight config of the next layer `stack` (the `block`, encoder or decoder) builds, from the stack's
    config. fairseq builds the layers in order, first to last, so a count of those built so far is the layer's index
    (for per-layer rules). With --{block}-layers-to-keep it builds only the kept ones and renumbers their weights in
    order (checkpoint_utils.prune_state_dict): the n-th layer built is the n-th kept one, and takes that layer's
    rule."""
    built = getattr(stack, "_fw_layers_built", 0)
    stack._fw_layers_built = built + 1
    keep = getattr(cfg, block).layers_to_keep  # "0,2" as on the command line, or None
    index = sorted(int(i) for i in keep.split(","))[built] if keep else built
    return stack.fw.layer(index)


class FastWeightEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, fw: FastWeightConfig, return_fc=False):
        self.fw = fw  # read by build_self_attention, which the base __init__ calls
        super().__init__(cfg, return_fc=return_fc)

    def build_self_attention(self, embed_dim, cfg):
        if not self.fw.uses("encoder"):
            return super().build_self_attention(embed_dim, cfg)
        return FastWeightAttention(embed_dim, cfg.encoder.attention_heads, self.fw, causal=False)


class FastWeightDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, fw: FastWeightConfig, no_encoder_attn=False):
        self.fw = fw
        super().__init__(cfg, no_encoder_attn=no_encoder_attn)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if not self.fw.uses("decoder"):
            return super().build_self_attention(embed_dim, cfg, add_bias_kv, add_zero_attn)
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError("fast-weight decoder self-attention does not support "
                             "--cross-self-attention, bias_kv or zero_attn")
        return FastWeightAttention(embed_dim, cfg.decoder.attention_heads, self.fw, causal=True)

    def build_encoder_attention(self, embed_dim, cfg):
        if not self.fw.uses("cross") and self.fw.cross_align:
            return AlignedMultiheadAttention.like_fairseq(self, embed_dim, cfg, self.fw)
        if not self.fw.uses("cross"):
            return super().build_encoder_attention(embed_dim, cfg)
        return FastWeightAttention(embed_dim, cfg.decoder.attention_heads, self.fw, causal=False,
                                   kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim,
                                   encoder_decoder_attention=True)


# The stacks keep the model's FastWeightConfig (`fw`) from before fairseq's __init__ builds their layers.
class FastWeightTransformerEncoder(TransformerEncoder):
    def __init__(self, cfg, fw: FastWeightConfig, dictionary, embed_tokens, return_fc=False):
        self.fw = fw
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)

    def build_encoder_layer(self, cfg):
        layer = FastWeightEncoderLayer(cfg, _next_layer_config(self, cfg, "encoder"), return_fc=self.return_fc)
        return _wrap_like_fairseq(layer, cfg)


class FastWeightTransformerDecoder(TransformerDecoder):
    def __init__(self, cfg, fw: FastWeightConfig, dictionary, embed_tokens, no_encoder_attn=False,
                 output_projection=None):
        self.fw = fw
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        if fw.decoder_positions == "none":  # --fw-decoder-positions
            self.embed_positions = None  # fairseq's decoder then adds no positions, in training and generation

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        # fairseq's generator sets the beam size on every attention of the decoder and never sets it back, and
        # fairseq's softmax cross-attention then keeps every beam-th source of a batch: after --eval-bleu's beam
        # search, validation and training forwards read the wrong sentences (or fail on an odd batch). A forward
        # without incremental state is no beam search.
        if incremental_state is None:
            self.set_beam_size(1)
        return super().forward(prev_output_tokens, encoder_out=encoder_out, incremental_state=incremental_state,
                               **kwargs)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        layer = FastWeightDecoderLayer(cfg, _next_layer_config(self, cfg, "decoder"), no_encoder_attn=no_encoder_attn)
        return _wrap_like_fairseq(layer, cfg)


@register_model("transformer_fw")
class FastWeightTransformerModel(RecordsFastWeightSettings, TransformerModel):
    """Transformer whose attention layers are fast weight programmers (Schlag et al., 2021)."""

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_fast_weight_args(parser)

    @classmethod
    def build_model(cls, args, task):
        # --fw-align-ratio data: the number, before the config reads it (args saved without the flag have no
        # `data` to count: the architecture then fills its preset value)
        settle_align_ratio(args, task)
        transformer_fw(args)  # fill options missing from older checkpoints
        config = FastWeightConfig.from_args(args)  # the one parse of the --fw-* args, before any layer is built
        settings = config.settings()
        # fairseq hands build_encoder and build_decoder only its copy of the args (TransformerConfig.from_namespace
        # copies every attribute); the config leaves the args before anything saves them
        args.fw_config = config
        try:
            model = super().build_model(args, task)
        finally:
            del args.fw_config
        model.record_fast_weight_settings(settings)
        model.criterion_warning = criterion_warning(args, config)
        return model

    def forward(self, *args, **kwargs):
        # the warning waits for the first training forward: generation and validation rebuild the model from the
        # same saved args, and have nothing to change
        if self.training and getattr(self, "criterion_warning", None):
            logger.warning(self.criterion_warning)
            self.criterion_warning = None
        return super().forward(*args, **kwargs)

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return FastWeightTransformerEncoder(cfg, cfg.fw_config, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return FastWeightTransformerDecoder(cfg, cfg.fw_config, tgt_dict, embed_tokens,
                                            no_encoder_attn=cfg.no_cross_attention)

    def set_beam_size(self, beam_size):
        """fairseq's generator tells only the model (not its decoder) the beam size; the
        cross-attention needs it to keep one source memory per sentence instead of per beam."""
        self.decoder.set_beam_size(beam_size)


# --fw-align-ratio data: the aligned cross-attention's length ratio counted from the training split, once, when a
# translation model is built for training. The number replaces `data` in the model's args, so that the checkpoint
# keeps it and every later build (resuming, fairseq-generate) reads the number, not the data.


def training_length_ratio(args, task) -> float:
    """Target tokens over source tokens of the task's training split (each side's end-of-sentence included),
    rounded to 3 decimals (the record spells it %g)."""
    split = getattr(args, "train_subset", None) or "train"
    try:
        if split not in getattr(task, "datasets", {}):
            task.load_dataset(split)
        data = task.dataset(split)
        source, target = np.asarray(data.src_sizes, dtype=np.int64), np.asarray(data.tgt_sizes, dtype=np.int64)
    except (FileNotFoundError, KeyError, AttributeError, TypeError) as err:
        raise cli_error(f"argument --fw-align-ratio: {ALIGN_RATIO_OF_DATA} counts the tokens of the training split "
                        f"{split!r}, which this task cannot give ({type(err).__name__}: {err}); allowed: a number "
                        "> 0") from None
    if source.sum() == 0 or target.sum() == 0:
        raise cli_error(f"argument --fw-align-ratio: the training split {split!r} has no tokens to count; allowed: "
                        "a number > 0")
    return round(float(target.sum()) / float(source.sum()), 3)


def settle_align_ratio(args, task) -> None:
    """Replace --fw-align-ratio data in args (as given on the command line) by the training split's ratio; a number
    stays as it is."""
    if str(getattr(args, "fw_align_ratio", None)) == ALIGN_RATIO_OF_DATA:
        args.fw_align_ratio = training_length_ratio(args, task)


def settle_fast_weight_args(args):
    """The --fw-* args of a translation model, filled and checked (architectures run while fairseq parses the
    arguments: errors stop there); and --*-layers-to-keep in the form that every reader of the parsed arguments
    (build_model, the checkpoint pruning) reads."""
    # fairseq's parser reads --{encoder,decoder}-layers-to-keep 0,2 as the list [0, 2], and its build_model and
    # checkpoint pruning split it as the text "0,2" (and fail on the list): they get the text
    for block in ("encoder", "decoder"):
        keep = getattr(args, f"{block}_layers_to_keep", None)
        if isinstance(keep, list):
            setattr(args, f"{block}_layers_to_keep", ",".join(map(str, keep)))
    encoder = ((args.encoder_embed_dim, "--encoder-embed-dim"),
               (args.encoder_attention_heads, "--encoder-attention-heads"))
    decoder = ((args.decoder_embed_dim, "--decoder-embed-dim"),
               (args.decoder_attention_heads, "--decoder-attention-heads"))
    decoder_layers = (args.decoder_layers, "--decoder-layers")
    set_fast_weight_defaults(args, "translation")
    # cross-attention's heads split the decoder's dim (the source is projected to it)
    check_fast_weight_args(args, {"encoder": encoder, "decoder": decoder, "cross": decoder},
                           {"encoder": (args.encoder_layers, "--encoder-layers"), "decoder": decoder_layers,
                            "cross": decoder_layers})


@register_model_architecture("transformer_fw", "transformer_fw")
def transformer_fw(args):
    """Transformer base (512 dim, 8 heads: d_key = 64) with fast weights everywhere."""
    base_architecture(args)
    settle_fast_weight_args(args)


@register_model_architecture("transformer_fw", "transformer_fw_big")
def transformer_fw_big(args):
    """The paper's MT model: Vaswani et al.'s big Transformer (1024 dim, 16 heads: d_key = 64)."""
    transformer_vaswani_wmt_en_de_big(args)
    settle_fast_weight_args(args)


@register_model_architecture("transformer_fw", "transformer_fw_small")
def transformer_fw_small(args):
    """For CPU experiments: 3+3 layers, 256 dim, 4 heads (d_key = 64), FFN 1024."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 256)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 1024)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.encoder_layers = getattr(args, "encoder_layers", 3)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 256)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 1024)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 3)
    transformer_fw(args)
