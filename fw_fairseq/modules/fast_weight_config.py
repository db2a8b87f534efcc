"""The fast-weight options of one model, parsed and validated once from fairseq's args."""
import argparse
import math
from dataclasses import dataclass
from typing import Dict, FrozenSet, Tuple

from fw_fairseq.modules.fast_weight_flags import (BETA_MAX, PLACES, UPDATE_RULES, cli_error, parse_beta_max,
                                                  parse_encoder_conv, parse_output_gate, parse_places, parse_rule,
                                                  places_set, positive_int)
from fw_fairseq.ops import FEATURE_MAPS, PHI_NORMS, RULES

DELTA_NORMS = tuple(PHI_NORMS)
FAVOR_REDRAWS = ("batch", "never")  # --fw-favor-redraw: a new R every training forward (the paper), or never
# The gate's bias starts at 5: alpha = sigmoid(5) = 0.993, so training starts near the delta rule.
GATE_BIAS_INIT = 5.0


def add_fast_weight_args(parser):
    """The `--fw-*` flags; fairseq shows them in the model's group of --help.

    fairseq hands add_args an argument group already; nesting another one is deprecated.
    """
    group = parser
    group.add_argument("--fw-feature-map", choices=FEATURE_MAPS,
                       help="feature map phi: elu (ELU+1, linear Transformer), dpfp "
                            "(DPFP-nu, d_dot = 2*d_key*nu), favor (FAVOR+, d_dot = 2m) or hedgehog "
                            "([softmax(x), softmax(-x)], d_dot = 2*d_key)")
    group.add_argument("--fw-update-rule", choices=UPDATE_RULES,
                       help="sum: W += phi(k) v^T with the z.phi(q) denominator (paper Table 1); "
                            "delta: the paper's delta rule with learned beta and sum-normalised phi; "
                            "gated_delta: the delta rule with a learned decay alpha = "
                            "sigmoid(w_alpha^T x + b) per head (Gated DeltaNet), b initialised to "
                            f"{GATE_BIAS_INIT:g} so that alpha starts near 1 "
                            f"({1 / (1 + math.exp(-GATE_BIAS_INIT)):.3f})")
    for place, where in (("encoder", "encoder self-attention"), ("decoder", "decoder self-attention"),
                         ("cross", "encoder-decoder attention")):
        group.add_argument(f"--fw-{place}-rule", type=parse_rule(f"--fw-{place}-rule"),
                           metavar="{" + ",".join(UPDATE_RULES) + "}",
                           help=f"the update rule of {where} (default: --fw-update-rule)")
    # default=None, not fairseq's suppressed default: a parsed command line always has the attribute,
    # so set_fast_weight_defaults can tell it from args saved before the flag existed (see there)
    group.add_argument("--fw-delta-norm", choices=DELTA_NORMS, default=None,
                       help="normalisation of phi(k) and phi(q) in the delta rules: sum (phi/sum(phi), "
                            "the paper) or l2 (phi/||phi||, DeltaNet: a write at beta = 1 overwrites "
                            "exactly; the default of the translation models); the sum rule divides "
                            "by z instead and ignores it")
    group.add_argument("--fw-beta-bias", type=float, metavar="B",
                       help="initial bias of the delta rules' beta projection: beta starts at "
                            "max*sigmoid(B) (default 0: beta = max/2); ignored by the sum rule")
    group.add_argument("--fw-delta-beta-max", type=parse_beta_max, metavar="{1,2}",
                       help="beta = max * sigmoid(w_beta^T x) of the delta rules: 1 keeps beta in "
                            "(0, 1); 2 allows (0, 2), negative eigenvalues of the update (Grazzi "
                            "et al. 2024); the sum rule has no beta and ignores it")
    group.add_argument("--fw-dpfp-nu", type=positive_int("--fw-dpfp-nu"), metavar="NU",
                       help="DPFP nu, 1..2*d_key-1 (d_dot = 2*d_key*nu)")
    group.add_argument("--fw-favor-features", type=positive_int("--fw-favor-features"),
                       metavar="M", help="FAVOR+ random features m (d_dot = 2m)")
    group.add_argument("--fw-favor-redraw", choices=FAVOR_REDRAWS, default=None,  # None: as --fw-delta-norm
                       help="FAVOR+'s random features in training: batch draws new ones every forward (the "
                            "paper; the default for language models), never keeps those drawn at initialisation "
                            "(the default for translation); eval never redraws")
    group.add_argument("--fw-output-gate", type=parse_output_gate, metavar="{none,channel,head}[:LIST]",
                       help="none: the read goes to the output projection as it is (the paper); channel "
                            "or head: multiplied first by sigmoid(W_g x + b_g) from the query's input x, "
                            "one gate per channel or one per head, in every fast-weight block or, with "
                            ":LIST (e.g. channel:cross), in those of encoder,decoder,cross only")
    # default=None: set_fast_weight_defaults tells a command line without it from args saved before it existed
    group.add_argument("--fw-encoder-conv", type=parse_encoder_conv, metavar="K", default=None,
                       help="encoder self-attention adds a depthwise convolution of width K over its values "
                            "to its read (beyond the paper; FLatten Transformer, Han et al. 2023): 0 (off, "
                            "the paper) or an odd K >= 3 (default 3 for translation)")
    group.add_argument("--fw-attention", type=parse_places, metavar="LIST",
                       help="which attention blocks use fast weights: 'all', 'none' (the standard "
                            "Transformer) or a comma-separated subset of encoder,decoder,cross; "
                            "the others stay softmax attention")


def set_fast_weight_defaults(args, feature_map="dpfp", update_rule="sum", dpfp_nu=2, favor_features=128,
                             places="all", beta_max=1, delta_norm="l2", encoder_conv=3, favor_redraw="batch"):
    """Architecture defaults; command-line values win (fairseq's getattr convention). The per-block
    rules stay None (they follow --fw-update-rule) so that a record of them is written only when set.

    --fw-delta-norm defaults to l2 for translation: with the paper's sum normalisation the delta rule
    in every block reached 0.49x softmax BLEU at 600 updates (seed 1), with L2 0.87x over three seeds
    (results/compare_attention).
    The parser always gives fw_delta_norm an attribute (None when not given); args saved in a
    checkpoint from before --fw-delta-norm existed have none, and were trained with sum normalisation.
    Likewise --fw-favor-redraw (before it, batch) and --fw-encoder-conv (before it, 0).
    """
    for place in PLACES:
        setattr(args, f"fw_{place}_rule", getattr(args, f"fw_{place}_rule", None))
    if not hasattr(args, "fw_delta_norm"):
        args.fw_delta_norm = "sum"
    args.fw_delta_norm = args.fw_delta_norm or delta_norm
    if not hasattr(args, "fw_encoder_conv"):
        args.fw_encoder_conv = 0
    if args.fw_encoder_conv is None:
        args.fw_encoder_conv = encoder_conv
    if getattr(args, "fw_beta_bias", None) is None:
        args.fw_beta_bias = 0.0
    args.fw_feature_map = getattr(args, "fw_feature_map", None) or feature_map
    args.fw_update_rule = getattr(args, "fw_update_rule", None) or update_rule
    args.fw_dpfp_nu = getattr(args, "fw_dpfp_nu", None) or dpfp_nu
    args.fw_favor_features = getattr(args, "fw_favor_features", None) or favor_features
    if not hasattr(args, "fw_favor_redraw"):
        args.fw_favor_redraw = "batch"
    args.fw_favor_redraw = args.fw_favor_redraw or favor_redraw
    args.fw_delta_beta_max = getattr(args, "fw_delta_beta_max", None) or beta_max
    args.fw_output_gate = getattr(args, "fw_output_gate", None) or "none"
    if getattr(args, "fw_attention", None) is None:
        args.fw_attention = parse_places(places)


# An attention block's size flags: (model dim, its flag), (heads, its flag).
BlockShape = Tuple[Tuple[int, str], Tuple[int, str]]


def check_attention_shapes(args, blocks: Dict[str, BlockShape]):
    """Reject, as argument errors, heads that do not divide the model dim and a DPFP nu beyond
    2*d_key-1 of a fast-weight block. `blocks` maps encoder/decoder/cross to their shape flags;
    architecture functions call this, so fairseq runs it while it parses the arguments."""
    places = places_set(args.fw_attention)
    for place, ((dim, dim_flag), (heads, heads_flag)) in blocks.items():
        if heads < 1 or dim % heads:
            raise cli_error(f"argument {heads_flag}: {heads} heads do not divide {dim_flag} "
                            f"{dim}; allowed: a divisor of {dim}")
        max_nu = 2 * (dim // heads) - 1
        if place in places and args.fw_feature_map == "dpfp" and int(args.fw_dpfp_nu) > max_nu:
            raise cli_error(f"argument --fw-dpfp-nu: {args.fw_dpfp_nu} is too large for {place} "
                            f"attention (d_key = {dim_flag} {dim} / {heads_flag} {heads} = "
                            f"{dim // heads}); allowed: 1..{max_nu} (2*d_key-1)")


@dataclass(frozen=True)
class FastWeightConfig:
    feature_map: str
    update_rule: str
    dpfp_nu: int
    favor_features: int
    places: FrozenSet[str]
    beta_max: int = 1
    # (place, rule) for the blocks whose --fw-{place}-rule was given; the others use update_rule
    block_rules: Tuple[Tuple[str, str], ...] = ()
    delta_norm: str = "sum"
    beta_bias: float = 0.0
    favor_redraw: str = "batch"
    output_gate: str = "none"
    encoder_conv: int = 0  # --fw-encoder-conv's width, 0 for none

    @classmethod
    def from_args(cls, args) -> "FastWeightConfig":
        # args saved before a flag existed were trained at its old behaviour: beta max 1, no
        # per-block rules, sum normalisation, beta bias 0
        block_rules = tuple((place, getattr(args, f"fw_{place}_rule", None)) for place in PLACES
                            if getattr(args, f"fw_{place}_rule", None) is not None)
        config = cls(args.fw_feature_map, args.fw_update_rule, int(args.fw_dpfp_nu),
                     int(args.fw_favor_features), places_set(args.fw_attention),
                     int(getattr(args, "fw_delta_beta_max", None) or 1), block_rules,
                     getattr(args, "fw_delta_norm", None) or "sum",
                     float(getattr(args, "fw_beta_bias", None) or 0.0),
                     getattr(args, "fw_favor_redraw", None) or "batch",
                     getattr(args, "fw_output_gate", None) or "none",
                     int(getattr(args, "fw_encoder_conv", None) or 0))
        config.check()
        return config

    def check(self):
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"--fw-feature-map got {self.feature_map!r}; allowed: {FEATURE_MAPS}")
        for flag, rule in (("--fw-update-rule", self.update_rule),
                           *((f"--fw-{place}-rule", rule) for place, rule in self.block_rules)):
            if rule not in UPDATE_RULES:
                raise ValueError(f"{flag} got {rule!r}; allowed: {UPDATE_RULES}")
        if self.beta_max not in BETA_MAX:
            raise ValueError(f"--fw-delta-beta-max got {self.beta_max!r}; allowed: {BETA_MAX}")
        if self.delta_norm not in DELTA_NORMS:
            raise ValueError(f"--fw-delta-norm got {self.delta_norm!r}; allowed: {DELTA_NORMS}")
        if self.favor_redraw not in FAVOR_REDRAWS:
            raise ValueError(f"--fw-favor-redraw got {self.favor_redraw!r}; allowed: {FAVOR_REDRAWS}")
        try:
            parse_output_gate(self.output_gate)
            parse_encoder_conv(str(self.encoder_conv))
        except argparse.ArgumentTypeError as err:
            raise ValueError(str(err)) from None

    def uses(self, place: str) -> bool:
        return place in self.places

    def rule(self, place: str) -> str:
        """The update rule of a block: its --fw-{place}-rule, else --fw-update-rule."""
        return dict(self.block_rules).get(place, self.update_rule)

    def gate(self, place: str) -> str:
        """The output gate of a block: --fw-output-gate's kind where its LIST (all blocks without one)
        names the block, else none."""
        kind, _, where = self.output_gate.partition(":")
        return kind if not where or place in where.split(",") else "none"

    def settings(self) -> Dict[str, str]:
        """What the attention computes, as the flags that set it: the weights of a checkpoint
        fit only these. Flags that do not apply (--fw-dpfp-nu under elu) are left out; the rules
        are recorded as --fw-update-rule when every fast-weight block has the same one, else one
        --fw-{place}-rule per fast-weight block (however the command line spelled it)."""
        out = {"--fw-attention": ",".join(p for p in PLACES if p in self.places) or "none"}
        if not self.places:
            return out
        out["--fw-feature-map"] = self.feature_map
        rules = {place: self.rule(place) for place in PLACES if place in self.places}
        if len(set(rules.values())) == 1:
            out["--fw-update-rule"] = next(iter(rules.values()))
        else:
            out.update({f"--fw-{place}-rule": rule for place, rule in rules.items()})
        if self.feature_map == "dpfp":
            out["--fw-dpfp-nu"] = str(self.dpfp_nu)
        if self.feature_map == "favor":
            out["--fw-favor-features"] = str(self.favor_features)
        if any("beta" in RULES[rule].scalars for rule in rules.values()):
            out["--fw-delta-beta-max"] = str(self.beta_max)
        if any(RULES[rule].normalised_phi for rule in rules.values()):
            out["--fw-delta-norm"] = self.delta_norm
        # the kind and the blocks gated among the fast-weight ones, however the command line spelled them
        gated = {place: self.gate(place) for place in rules if self.gate(place) != "none"}
        kind = next(iter(gated.values()), "none")
        out["--fw-output-gate"] = kind if len(gated) in (0, len(rules)) else f"{kind}:{','.join(gated)}"
        if "encoder" in self.places:
            out["--fw-encoder-conv"] = str(self.encoder_conv)
        return out


def with_later_flags(settings: Dict[str, str]) -> Dict[str, str]:
    """A settings record completed with the flags recorded only since it was written, at the
    value every model had before them: a delta-rule record without --fw-delta-beta-max is 1, without
    --fw-delta-norm sum; a fast-weight record without --fw-output-gate none; one with fast weights in the
    encoder without --fw-encoder-conv 0."""
    rules = [settings.get(flag) for flag in ("--fw-update-rule", *(f"--fw-{p}-rule" for p in PLACES))]
    rules = [RULES[rule] for rule in rules if rule in RULES]
    if any("beta" in rule.scalars for rule in rules) and "--fw-delta-beta-max" not in settings:
        settings = {**settings, "--fw-delta-beta-max": "1"}
    if any(rule.normalised_phi for rule in rules) and "--fw-delta-norm" not in settings:
        settings = {**settings, "--fw-delta-norm": "sum"}
    if settings.get("--fw-attention", "none") != "none" and "--fw-output-gate" not in settings:
        settings = {**settings, "--fw-output-gate": "none"}
    if "encoder" in settings.get("--fw-attention", "").split(",") and "--fw-encoder-conv" not in settings:
        settings = {**settings, "--fw-encoder-conv": "0"}
    return settings


def per_block_rules(settings: Dict[str, str]) -> Dict[str, str]:
    """A settings record with --fw-update-rule spelled as one --fw-{place}-rule per fast-weight block,
    so that a uniform record compares flag by flag with a per-block one."""
    rule = settings.get("--fw-update-rule")
    if rule is None:
        return settings
    places = [p for p in PLACES if p in settings.get("--fw-attention", "").split(",")]
    out = {flag: value for flag, value in settings.items() if flag != "--fw-update-rule"}
    return {**out, **{f"--fw-{place}-rule": rule for place in places}}
