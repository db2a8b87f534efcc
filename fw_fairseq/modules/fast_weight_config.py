"""The fast-weight options of one model, parsed and validated once from fairseq's args: the parser, the
architectures' defaults, the config, its checkpoint record and the reading of older records are all derived from
the flag table (flag_table.py)."""
import argparse
from dataclasses import dataclass, replace
from typing import Dict, FrozenSet, Tuple, Union

from fw_fairseq.modules.fast_weight_flags import (BETA_MAX, PLACES, UPDATE_RULES, cli_error, layer_rules,
                                                  parse_encoder_conv, parse_output_gate, places_set)
from fw_fairseq.modules.flag_table import FAMILIES, FAVOR_REDRAWS, FLAGS, Blocks, Derived
from fw_fairseq.ops import FEATURE_MAPS, PHI_NORMS, RULES

DELTA_NORMS = tuple(PHI_NORMS)


def add_fast_weight_args(parser):
    """The table's `--fw-*` flags; fairseq shows them in the model's group of --help (it hands add_args an argument
    group already; nesting another one is deprecated). A flag that older args lack has default=None, not fairseq's
    suppressed default: a parsed command line always has its attribute, so set_fast_weight_defaults tells it from
    args saved before the flag existed."""
    for flag in FLAGS:
        parser.add_argument(flag.name, help=flag.help, **flag.options,
                            **({"default": None} if flag.before is not None else {}))


def set_fast_weight_defaults(args, family, **overrides):
    """Each flag's default in `family` (flag_table.FAMILIES), or the architecture's override of it (by
    FastWeightConfig field); values given on the command line win (fairseq's getattr convention), and args saved
    before a flag existed get the value they were trained with (its `before`). A per-block rule without a default
    stays None (it follows --fw-update-rule), so that a record of it is written only when set. A Derived default is
    taken last, from the others' final values and the names of the flags that had a value before."""
    if family not in FAMILIES:
        raise ValueError(f"set_fast_weight_defaults: family={family!r}; allowed: {FAMILIES}")
    given = frozenset(flag.name for flag in FLAGS if getattr(args, flag.attr, None) is not None)
    derived = []
    for flag in FLAGS:
        if not hasattr(args, flag.attr) and flag.before is not None:
            setattr(args, flag.attr, flag.before)
        elif getattr(args, flag.attr, None) is None:
            default = overrides.get(flag.field, flag.defaults.get(family))
            if isinstance(default, Derived):
                derived.append((flag, default))
            else:
                setattr(args, flag.attr, default)
    for flag, default in derived:
        setattr(args, flag.attr, default.of(args, given))


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


def check_layer_rules(args, layers: Dict[str, Tuple[int, str]]):
    """Reject, as an argument error, a per-layer --fw-{place}-rule whose count of rules is not the block's count
    of layers. `layers` maps encoder/decoder/cross to (layers, its flag); architectures call this."""
    for place, (count, flag) in layers.items():
        rules = layer_rules(getattr(args, f"fw_{place}_rule", None) or "")
        if len(rules) > 1 and len(rules) != count:
            raise cli_error(f"argument --fw-{place}-rule: {len(rules)} rules for {flag} {count}; allowed: one "
                            f"rule, or one per layer ({count})")


def check_decoder_positions(args):
    """Reject, as an argument error, --fw-decoder-positions none over a softmax decoder self-attention, which
    needs the positions to order the target; architectures call this."""
    if args.fw_decoder_positions == "none" and "decoder" not in places_set(args.fw_attention):
        raise cli_error("argument --fw-decoder-positions: none needs fast-weight decoder self-attention (decoder in "
                        f"--fw-attention, here {args.fw_attention}); allowed with a softmax decoder: absolute")


@dataclass(frozen=True)
class FastWeightConfig:
    feature_map: str
    update_rule: str
    dpfp_nu: int
    favor_features: int
    places: FrozenSet[str]
    beta_max: Union[int, float] = 1  # the parsed value as it is: 1 and 2 stay integers, as checkpoints record them
    # (place, rule) for the blocks whose --fw-{place}-rule was given; the others use update_rule
    block_rules: Tuple[Tuple[str, str], ...] = ()
    delta_norm: str = "sum"
    beta_bias: float = 0.0
    favor_redraw: str = "batch"
    output_gate: str = "none"
    encoder_conv: int = 0  # --fw-encoder-conv's width, 0 for none
    decoder_conv: int = 0  # --fw-decoder-conv's width, 0 for none
    t2r_features: int = 32  # --fw-t2r-features: T2R's K
    hedgehog_trainable: bool = False  # --fw-hedgehog-trainable
    cross_align: int = 0  # --fw-cross-align's P, 0 for none
    decoder_positions: str = "absolute"  # --fw-decoder-positions

    @classmethod
    def from_args(cls, args) -> "FastWeightConfig":
        # args saved before a flag existed were trained at its `before` (flag_table.py)
        values = {}
        for flag in FLAGS:
            value = getattr(args, flag.attr, None)
            value = flag.before if value is None else value
            if flag.field is not None and value is not None:
                kind = cls.__dataclass_fields__[flag.field].type
                values[flag.field] = kind(value) if kind in (int, float, str) else value
        values["places"] = places_set(values["places"])
        block_rules = tuple((place, getattr(args, f"fw_{place}_rule", None)) for place in PLACES
                            if getattr(args, f"fw_{place}_rule", None) is not None)
        config = cls(block_rules=block_rules, **values)
        config.check()
        return config

    def check(self):
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"--fw-feature-map got {self.feature_map!r}; allowed: {FEATURE_MAPS}")
        for flag, rules in (("--fw-update-rule", self.update_rule),
                            *((f"--fw-{place}-rule", rules) for place, rules in self.block_rules)):
            if any(rule not in UPDATE_RULES for rule in layer_rules(rules)):
                raise ValueError(f"{flag} got {rules!r}; allowed: {', '.join(UPDATE_RULES)}")
        if not 0 < self.beta_max <= BETA_MAX:
            raise ValueError(f"--fw-delta-beta-max got {self.beta_max!r}; allowed: a number in (0, {BETA_MAX}]")
        if self.delta_norm not in DELTA_NORMS:
            raise ValueError(f"--fw-delta-norm got {self.delta_norm!r}; allowed: {DELTA_NORMS}")
        if self.favor_redraw not in FAVOR_REDRAWS:
            raise ValueError(f"--fw-favor-redraw got {self.favor_redraw!r}; allowed: {FAVOR_REDRAWS}")
        try:
            parse_output_gate(self.output_gate)
            parse_encoder_conv(str(self.encoder_conv))
        except argparse.ArgumentTypeError as err:
            raise ValueError(str(err)) from None

    @property
    def redraws_features(self) -> bool:
        """Whether every training forward maps into new random features (FAVOR+ with --fw-favor-redraw batch), so
        that a state carried from one forward to the next would mix feature spaces."""
        return self.feature_map == "favor" and self.favor_redraw == "batch"

    def uses(self, place: str) -> bool:
        return place in self.places

    def rules(self, place: str) -> Tuple[str, ...]:
        """The update rules of a block: its --fw-{place}-rule, else --fw-update-rule; one for every layer (also
        where the flag listed the same rule for each), or one per layer."""
        rules = layer_rules(dict(self.block_rules).get(place, self.update_rule))
        return rules if len(set(rules)) > 1 else rules[:1]

    def rule(self, place: str) -> str:
        """The update rule of one layer's block (a config of one layer: `layer`)."""
        rules = self.rules(place)
        if len(rules) > 1:
            raise ValueError(f"--fw-{place}-rule {','.join(rules)} has a rule per layer; take the layer's config")
        return rules[0]

    def layer(self, index: int) -> "FastWeightConfig":
        """The config of the index-th layer (from 0): every per-layer rule resolved to that layer's."""
        def at(place):
            rules = self.rules(place)
            if len(rules) == 1:
                return rules[0]
            if index >= len(rules):
                raise ValueError(f"layer {index + 1} has no rule in {','.join(rules)} (one per layer)")
            return rules[index]
        return replace(self, block_rules=tuple((place, at(place)) for place, _ in self.block_rules))

    def gate(self, place: str) -> str:
        """The output gate of a block: --fw-output-gate's kind where its LIST (all blocks without one)
        names the block, else none."""
        kind, _, where = self.output_gate.partition(":")
        return kind if not where or place in where.split(",") else "none"

    def blocks(self) -> Blocks:
        rules = (rule for place in PLACES if place in self.places for rule in self.rules(place))
        return Blocks(self.feature_map, tuple(RULES[rule] for rule in rules), self.places)

    def gate_record(self) -> str:
        """--fw-output-gate as the record keeps it: the kind, and the gated blocks among the fast-weight ones where
        not all are, however the command line spelled it."""
        fast = [place for place in PLACES if place in self.places]
        gated = [place for place in fast if self.gate(place) != "none"]
        kind = self.gate(gated[0]) if gated else "none"
        return kind if len(gated) in (0, len(fast)) else f"{kind}:{','.join(gated)}"

    def settings(self) -> Dict[str, str]:
        """What the attention computes, as the flags that set it: the weights of a checkpoint fit only these.
        Flags that do not apply (--fw-dpfp-nu under elu) are left out (flag_table's `recorded`); the rules are
        recorded as --fw-update-rule when every fast-weight block has the same one, else one --fw-{place}-rule per
        fast-weight block (however the command line spelled it)."""
        out = {"--fw-attention": ",".join(p for p in PLACES if p in self.places) or "none"}
        if not self.places:
            return out
        out["--fw-feature-map"] = self.feature_map
        rules = {place: ",".join(self.rules(place)) for place in PLACES if place in self.places}
        if len(set(rules.values())) == 1:
            out["--fw-update-rule"] = next(iter(rules.values()))
        else:
            out.update({f"--fw-{place}-rule": rule for place, rule in rules.items()})
        blocks = self.blocks()
        for flag in FLAGS:
            if flag.recorded is not None and flag.recorded(blocks):
                out[flag.name] = flag.value(self) if flag.value else str(getattr(self, flag.field))
        return out


def _blocks_of(settings: Dict[str, str]) -> Blocks:
    """The Blocks a settings record describes."""
    values = [settings.get(flag) for flag in ("--fw-update-rule", *(f"--fw-{p}-rule" for p in PLACES))]
    rules = [rule for value in values if value is not None for rule in layer_rules(value)]
    places = frozenset(settings.get("--fw-attention", "none").split(",")) - {"none"}
    return Blocks(settings.get("--fw-feature-map"), tuple(RULES[rule] for rule in rules if rule in RULES), places)


def with_later_flags(settings: Dict[str, str]) -> Dict[str, str]:
    """A settings record completed with the flags recorded only since it was written, where the table knows what
    their absence meant (`unrecorded`: the value every model had before the flag); the others stay absent, and a
    load cannot check them (checkpoints.py says so)."""
    blocks = _blocks_of(settings)
    later = {flag.name: flag.unrecorded for flag in FLAGS
             if flag.unrecorded is not None and flag.name not in settings and flag.recorded(blocks)}
    return {**settings, **later}


def per_block_rules(settings: Dict[str, str]) -> Dict[str, str]:
    """A settings record with --fw-update-rule spelled as one --fw-{place}-rule per fast-weight block,
    so that a uniform record compares flag by flag with a per-block one."""
    rule = settings.get("--fw-update-rule")
    if rule is None:
        return settings
    places = [p for p in PLACES if p in settings.get("--fw-attention", "").split(",")]
    out = {flag: value for flag, value in settings.items() if flag != "--fw-update-rule"}
    return {**out, **{f"--fw-{place}-rule": rule for place in places}}
