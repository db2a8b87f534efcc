"""The `--fw-*` flags, one row each, and the presets that give their defaults: the parser, the architectures'
defaults, FastWeightConfig's fields, the checkpoint record and the reading of older records are derived from them
(fast_weight_config.py).

A row says: the flag and the FastWeightConfig field it sets; its argparse options and help (its type or choices
also validate the values of args that did not come through the parser); the value that args saved before the flag
existed imply (`before`; None for the flags as old as the plugin's checkpoints); `recorded`, which blocks make the
checkpoint record keep it, a predicate of the attention (Blocks: the feature map, the fast-weight blocks' rule
records, the blocks); and `unrecorded`, what a record written before it was recorded means (a flag recorded since it
existed: its `before`; one recorded only later: unknown, and a load then cannot check it). --fw-attention and the
rules are rows for the parser and the presets; fast_weight_config.settings writes their record (one rule, or one
per block).

A preset (--fw-preset) is a plain table of values, flag -> value, with a second table that replaces some of them
under FAVOR+; a flag given on the command line wins over both. Absent from a preset: a per-block rule, which then
follows --fw-update-rule.
"""
import math
from dataclasses import dataclass, field
from typing import Callable, FrozenSet, Mapping, Optional, Tuple

from fw_fairseq.modules.fast_weight_flags import (BETA_MAX, UPDATE_RULES, int_at_least, parse_align_ratio,
                                                  parse_beta_max, parse_encoder_conv, parse_output_gate, parse_places,
                                                  parse_rule, parse_switch)
from fw_fairseq.ops import FEATURE_MAPS, PHI_NORMS, RULES

FAVOR_REDRAWS = ("batch", "never")  # --fw-favor-redraw: a new R every training forward (the paper), or never
DECODER_POSITIONS = ("absolute", "none")  # --fw-decoder-positions: fairseq's positional embedding, or none
GATE_BIAS_INIT = 5.0  # the gated rule's alpha bias: alpha = sigmoid(5) = 0.993, training starts near the delta rule


@dataclass(frozen=True)
class Blocks:
    """What decides which flags a record keeps: the feature map, the fast-weight blocks' rules (UpdateRule
    records) and the set of fast-weight blocks."""

    feature_map: Optional[str]
    rules: Tuple
    places: FrozenSet[str]


@dataclass(frozen=True)
class Derived:
    """A preset's value that follows the values of other flags: `of(args)` gives it once those are set; `text` says
    which (the README's table of flags)."""

    of: Callable
    text: str


@dataclass(frozen=True)
class Flag:
    name: str  # "--fw-delta-norm"
    field: Optional[str]  # the FastWeightConfig field it sets (None: --fw-{place}-rule, kept as block_rules)
    help: str
    options: Mapping = field(default_factory=dict)  # add_argument's type, choices, metavar
    before: object = None  # what args saved before the flag existed imply; None: as old as the plugin's args
    recorded: Optional[Callable[[Blocks], bool]] = None  # the record keeps it where this holds
    unrecorded: Optional[str] = None  # what a record without it means where `recorded` holds; None: unknown
    value: Optional[Callable] = None  # its value in the record, of a FastWeightConfig (None: str of the field)

    @property
    def attr(self):
        """The args attribute: --fw-delta-norm -> fw_delta_norm."""
        return self.name[2:].replace("-", "_")


def _uses_rule_with(predicate):
    return lambda blocks: any(predicate(rule) for rule in blocks.rules)


_PLACE_WORDS = {"encoder": "encoder self-attention", "decoder": "decoder self-attention",
                "cross": "encoder-decoder attention"}

FLAGS = (
    Flag("--fw-preset", None, "the defaults of every other --fw-* flag: translation (the transformer_fw* "
         "architectures' default), paper (the paper's Table 1 blocks) or lm (the transformer_lm_fw* architectures' "
         "default); a flag given wins over its preset", dict(choices=("translation", "paper", "lm")),
         before="paper"),  # args saved before the presets hold every value but a per-block rule, which followed
    # --fw-update-rule as it does under the paper's preset
    Flag("--fw-feature-map", "feature_map", "feature map phi: elu (ELU+1, linear Transformer), dpfp (DPFP-nu, "
         "d_dot = 2*d_key*nu), favor (FAVOR+, d_dot = 2m), hedgehog ([softmax(x), softmax(-x)], d_dot = 2*d_key) "
         "or t2r (relu(W x + b) learned per head, d_dot = --fw-t2r-features; for converted softmax models)",
         dict(choices=FEATURE_MAPS)),
    Flag("--fw-update-rule", "update_rule", "sum: W += phi(k) v^T with the z.phi(q) denominator (paper Table 1); "
         "delta: the paper's delta rule with learned beta and normalised phi; gated_delta: the delta rule with a "
         "learned decay alpha = sigmoid(w_alpha^T x + b) per head (Gated DeltaNet), b initialised to "
         f"{GATE_BIAS_INIT:g} so that alpha starts near 1 ({1 / (1 + math.exp(-GATE_BIAS_INIT)):.3f}); delta_z: the "
         "delta rule's read divided by z.phi(q), z the same rule's memory of a constant 1 (beyond the paper)",
         dict(choices=UPDATE_RULES)),
    Flag("--fw-dpfp-nu", "dpfp_nu", "DPFP nu, 1..2*d_key-1 (d_dot = 2*d_key*nu)",
         dict(type=int_at_least("--fw-dpfp-nu", 1), metavar="NU"),
         recorded=lambda blocks: blocks.feature_map == "dpfp"),
    Flag("--fw-favor-features", "favor_features", "FAVOR+ random features m (d_dot = 2m)",
         dict(type=int_at_least("--fw-favor-features", 1), metavar="M"),
         recorded=lambda blocks: blocks.feature_map == "favor"),
    Flag("--fw-attention", "places", "which attention blocks use fast weights: 'all', 'none' (the standard "
         "Transformer) or a comma-separated subset of encoder,decoder,cross; the others stay softmax attention",
         dict(type=parse_places, metavar="LIST")),
    Flag("--fw-delta-beta-max", "beta_max", "beta = max * sigmoid(w_beta^T x) of the delta rules, max in "
         f"(0, {BETA_MAX}]: 1 keeps beta in (0, 1); 2 allows (0, 2), negative eigenvalues of the update (Grazzi et "
         "al. 2024); below 1 every write moves its key's slot at most max of the way to its value; the sum rule "
         "has no beta and ignores it", dict(type=parse_beta_max, metavar="MAX"), before=1,
         recorded=_uses_rule_with(lambda rule: "beta" in rule.scalars), unrecorded="1"),
    *(Flag(f"--fw-{place}-rule", None, f"the update rule of {words} (default: its preset's, else "
           "--fw-update-rule), or one rule per layer, comma-separated, first layer first (e.g. sum,delta)",
           dict(type=parse_rule(f"--fw-{place}-rule"), metavar="RULE[,RULE...]"))
      for place, words in _PLACE_WORDS.items()),
    Flag("--fw-delta-norm", "delta_norm", "normalisation of phi(k) and phi(q) in the delta rules: sum (phi/sum(phi), "
         "the paper) or l2 (phi/||phi||, DeltaNet: a write at beta = 1 overwrites exactly); the sum rule divides by "
         "z instead and ignores it", dict(choices=tuple(PHI_NORMS)), before="sum",
         recorded=_uses_rule_with(lambda rule: rule.normalised_phi), unrecorded="sum"),
    Flag("--fw-beta-bias", "beta_bias", "initial bias of the delta rules' beta projection: beta starts at "
         "max*sigmoid(B) (0: beta = max/2); ignored by the sum rule", dict(type=float, metavar="B"), before=0.0),
    # 32 features: T2R's choice for machine translation (Kasai et al. 2021, d_key 64); older args never used t2r
    Flag("--fw-t2r-features", "t2r_features", "T2R's learned features K per head (d_dot = K)",
         dict(type=int_at_least("--fw-t2r-features", 1), metavar="K"), before=32,
         recorded=lambda blocks: blocks.feature_map == "t2r", unrecorded="32"),
    Flag("--fw-hedgehog-trainable", "hedgehog_trainable", "hedgehog: a learned per-head d_key x d_key linear layer "
         "before the softmaxes, the identity at the start (Hedgehog's own map; for converted softmax models)",
         dict(type=parse_switch("--fw-hedgehog-trainable"), nargs="?", const=True, metavar="{0,1}"),
         before=False, recorded=lambda blocks: blocks.feature_map == "hedgehog", unrecorded="0",
         value=lambda config: str(int(config.hedgehog_trainable))),
    Flag("--fw-favor-redraw", "favor_redraw", "FAVOR+'s random features in training: batch draws new ones every "
         "forward (the paper), never keeps those drawn at initialisation; eval never redraws",
         dict(choices=FAVOR_REDRAWS), before="batch", recorded=lambda blocks: blocks.feature_map == "favor"),
    Flag("--fw-output-gate", "output_gate", "none: the read goes to the output projection as it is (the paper); "
         "channel or head: multiplied first by sigmoid(W_g x + b_g) from the query's input x, one gate per channel "
         "or one per head; rms: each head's read over its root mean square, times a learned weight per channel "
         "(DeltaNet's output norm); in every fast-weight block or, with :LIST (e.g. channel:cross), in those of "
         "encoder,decoder,cross only", dict(type=parse_output_gate, metavar="{none,channel,head,rms}[:LIST]"),
         before="none", recorded=lambda blocks: bool(blocks.places), unrecorded="none",
         value=lambda config: config.gate_record()),
    Flag("--fw-encoder-conv", "encoder_conv", "encoder self-attention adds a depthwise convolution of width K over "
         "its values to its read (beyond the paper; FLatten Transformer, Han et al. 2023): 0 (off, the paper) or an "
         "odd K >= 3", dict(type=parse_encoder_conv, metavar="K"), before=0,
         recorded=lambda blocks: "encoder" in blocks.places, unrecorded="0"),
    Flag("--fw-decoder-conv", "decoder_conv", "decoder self-attention adds a causal depthwise convolution of width "
         "K over its values (the position and the K - 1 before it) to its read (beyond the paper): 0 (off) or K >= "
         "1", dict(type=int_at_least("--fw-decoder-conv", 0), metavar="K"), before=0,
         recorded=lambda blocks: "decoder" in blocks.places, unrecorded="0"),
    # The paper's delta-rule language models need no positional encoding (section 6.3, Tables 3 and 4): the rule's
    # state orders the sequence, and a target longer than any in training meets no position it never saw
    Flag("--fw-decoder-positions", "decoder_positions", "absolute: the decoder adds fairseq's positional embedding "
         "to its input embeddings (the paper's translation models); none: it adds none, and its fast-weight "
         "self-attention (with --fw-decoder-conv, its convolution) alone orders the target, as in the paper's "
         "delta-rule language models (beyond the paper for translation)", dict(choices=DECODER_POSITIONS),
         before="absolute", recorded=lambda blocks: "decoder" in blocks.places, unrecorded="absolute"),
    # recorded for every model: a softmax cross-attention takes the same prior (aligned_softmax.py), so that a
    # record without it could not tell a plain softmax model from one with the prior
    Flag("--fw-cross-align", "cross_align", "the cross-attention weighs each source position by cos^(2P) of half "
         "its angle to the target position's (angles pi*position/source length, the target's position over "
         "--fw-align-ratio; beyond the paper): 0 (off, the paper) or P >= 1, narrower as P grows. A fast-weight "
         "cross-attention multiplies its scores by it (decoding keeps a short source's weights or a memory (2P+1) "
         "times wider; the sum rule's fused GPU read takes it, the CPU kernels do not), a softmax one adds its log "
         "to its logits",
         dict(type=int_at_least("--fw-cross-align", 0), metavar="P"), before=0, recorded=lambda blocks: True,
         unrecorded="0"),
    Flag("--fw-align-ratio", "align_ratio", "the length ratio r of --fw-cross-align: target position i aims at "
         "source position i/r. A number > 0 (1: the target as long as the source), or data: the training split's "
         "target tokens over its source tokens, counted when the model is built (the checkpoint keeps the number)",
         dict(type=parse_align_ratio, metavar="{R,data}"), before=1.0, recorded=lambda blocks: True,
         unrecorded="1", value=lambda config: f"{config.align_ratio:g}"),
    # heads free of a fixed cross-attention prior: You et al. (2020) and Rios et al. (2021) find that one fixed for
    # every head hurts unless some heads stay free
    Flag("--fw-align-free-heads", "align_free_heads", "the last F heads of each cross-attention read the source "
         "without the --fw-cross-align prior, the others with it: 0 (every head takes it) to the heads less one. "
         "A fast-weight cross-attention with free heads takes the PyTorch read, not the fused GPU read",
         dict(type=int_at_least("--fw-align-free-heads", 0), metavar="F"), before=0, recorded=lambda blocks: True,
         unrecorded="0"),
)
BY_NAME = {flag.name: flag for flag in FLAGS}


def _delta_norm_of_translation(args) -> str:
    """l2 where a rule that normalises phi is in the encoder's self-attention or the cross-attention (a rule per
    layer: any of them), sum where only the decoder's self-attention has one (or none has)."""
    places = set(parse_places(args.fw_attention).split(",")) - {"none", "decoder"}
    rules = (rule for place in places for rule in (getattr(args, f"fw_{place}_rule") or args.fw_update_rule).split(","))
    return "l2" if any(RULES[rule].normalised_phi for rule in rules) else "sum"


def _cross_align_of_translation(args) -> int:
    """4 where the cross-attention is fast weights, 0 (softmax as it is) where it is softmax."""
    return 4 if "cross" in parse_places(args.fw_attention).split(",") else 0


# The paper's blocks (Table 1): DPFP-2 (the feature map the configs name for each row), the sum rule everywhere,
# FAVOR+ redrawing its features every batch, nothing beyond the paper
PAPER = {"--fw-feature-map": "dpfp", "--fw-update-rule": "sum", "--fw-dpfp-nu": 2, "--fw-favor-features": 128,
         "--fw-attention": "encoder,decoder,cross", "--fw-delta-beta-max": 1, "--fw-delta-norm": "sum",
         "--fw-beta-bias": 0.0, "--fw-t2r-features": 32, "--fw-hedgehog-trainable": False,
         "--fw-favor-redraw": "batch", "--fw-output-gate": "none", "--fw-encoder-conv": 0, "--fw-decoder-conv": 0,
         "--fw-decoder-positions": "absolute", "--fw-cross-align": 0, "--fw-align-ratio": 1.0,
         "--fw-align-free-heads": 0}
PRESETS = {
    "translation": {
        **PAPER,
        # the delta rule in the decoder's self-attention: with the aligned read and unlikelihood training it meets
        # every long-output mark on the German catalog benchmark, where the sum rule there runs away more often
        # than softmax (docs/long_outputs.md); on an H200 it trains at the sum rule's speed
        "--fw-decoder-rule": "delta",
        # with the sum normalisation the delta rule in every block reached 0.49x softmax BLEU at 600 updates (seed
        # 1), with L2 0.87x over three seeds (results/compare_attention); in the decoder's self-attention alone the
        # sum normalisation keeps the L2 rule's test BLEU, and long translations over twice their reference fall
        # from 36, 30 and 283 to 3, 2 and 16 (results/compare_attention/long_outputs)
        "--fw-delta-norm": Derived(_delta_norm_of_translation,
                                   "`sum`; `l2` with a delta rule in the encoder or cross-attention"),
        # FAVOR+ keeping the features drawn at initialisation: 0.97x softmax BLEU at 600 updates over three seeds
        # with the encoder's convolution, against 0.74x redrawing them every batch (results/compare_attention/conv)
        "--fw-favor-redraw": "never",
        "--fw-encoder-conv": 3,
        # a long source's read stops being an average: DPFP-2 with P = 4 lifts the long-message BLEU above
        # softmax's in every setting measured (docs/long_outputs.md); a softmax cross-attention is left as the
        # paper's unless asked for the prior
        "--fw-cross-align": Derived(_cross_align_of_translation, "`4` with fast-weight cross-attention, else `0`")},
    "paper": PAPER,
    # the paper's language models (section 6.3): the delta rule with sum-normalised phi, in the decoder
    "lm": {**PAPER, "--fw-update-rule": "delta", "--fw-attention": "decoder"},
}
# A preset's values under FAVOR+. Translation: FAVOR+'s trained keys put nearly all of phi on one random feature, so
# the delta rule's sum-normalised write nearly overwrites its key's slot, and with the other maps' values its long
# translations run past twice their reference more often than softmax's; a smaller beta and the decoder's
# convolution bring them to softmax's count (docs/long_outputs.md)
FAVOR = {"translation": {"--fw-delta-beta-max": 0.25, "--fw-decoder-conv": 3}}
