"""The fast-weight options of one model: the architectures fill the `--fw-*` args from a preset, FastWeightConfig
reads them once per model, and its record says what the attention computes. Its fields, their defaults (the values
that args saved before each flag existed imply) and their validation are the flag table's (flag_table.py)."""
import argparse
from dataclasses import field, make_dataclass, replace
from typing import Dict, FrozenSet, Tuple

from fw_fairseq.modules.fast_weight_flags import PLACES, cli_error, parse_places
from fw_fairseq.modules.flag_table import BY_NAME, FAVOR, FLAGS, PRESETS, Blocks, Derived
from fw_fairseq.ops import RULES


def add_fast_weight_args(parser):
    """The table's `--fw-*` flags; fairseq shows them in the model's group of --help (it hands add_args an argument
    group already; nesting another one is deprecated). A flag that older args lack has default=None, not fairseq's
    suppressed default: a parsed command line always has its attribute, so set_fast_weight_defaults tells it from
    args saved before the flag existed."""
    for flag in FLAGS:
        parser.add_argument(flag.name, help=flag.help, **flag.options,
                            **({"default": None} if flag.before is not None else {}))


def set_fast_weight_defaults(args, preset: str):
    """Give each `--fw-*` flag without a value its value: args saved before the flag existed its `before` (what they
    were trained with), the others their preset's, --fw-preset's or else the architecture's `preset`, with the
    preset's FAVOR+ values under FAVOR+; a Derived value last, from the others' values. Values only decide: a flag
    given its preset's value builds what leaving it out builds."""
    # args saved before a softmax cross-attention took --fw-cross-align were filled with the translation preset's 4
    # whatever the blocks, and such a model never read it
    attention = getattr(args, "fw_attention", None)
    softmax_cross_unaligned = (not hasattr(args, "fw_align_ratio") and attention is not None
                               and "cross" not in places_of(parse_places(attention)))
    for flag in FLAGS:
        if not hasattr(args, flag.attr) and flag.before is not None:
            setattr(args, flag.attr, flag.before)
    if softmax_cross_unaligned:
        args.fw_cross_align = 0
    args.fw_preset = _parsed(BY_NAME["--fw-preset"], args.fw_preset or preset)
    table = PRESETS[args.fw_preset]
    if (getattr(args, "fw_feature_map", None) or table["--fw-feature-map"]) == "favor":
        table = {**table, **FAVOR.get(args.fw_preset, {})}
    unset = [flag for flag in FLAGS if getattr(args, flag.attr, None) is None]
    derived = [flag for flag in unset if isinstance(table.get(flag.name), Derived)]
    for flag in unset:
        setattr(args, flag.attr, None if flag in derived else table.get(flag.name))
    for flag in derived:
        setattr(args, flag.attr, table[flag.name].of(args))


def check_fast_weight_args(args, shapes: Dict[str, Tuple[Tuple[int, str], Tuple[int, str]]],
                           layers: Dict[str, Tuple[int, str]]):
    """Reject, as argument errors, what only several flags can judge: heads that do not divide the model dim, a DPFP
    nu beyond 2*d_key-1 of a fast-weight block, a per-layer --fw-{place}-rule whose count of rules is not the
    block's count of layers, free heads of the cross-attention's prior without the prior or with no head left to
    it, and --fw-decoder-positions none over a softmax decoder self-attention (which needs the positions to order
    the target). `shapes` maps each block to ((model dim, its flag), (heads, its flag)), `layers`
    to (layers, its flag); architectures call this, so that fairseq runs it while it parses the arguments."""
    places = places_of(args.fw_attention)
    for place, ((dim, dim_flag), (heads, heads_flag)) in shapes.items():
        if heads < 1 or dim % heads:
            raise cli_error(f"argument {heads_flag}: {heads} heads do not divide {dim_flag} {dim}; allowed: a "
                            f"divisor of {dim}")
        max_nu = 2 * (dim // heads) - 1
        if place in places and args.fw_feature_map == "dpfp" and int(args.fw_dpfp_nu) > max_nu:
            raise cli_error(f"argument --fw-dpfp-nu: {args.fw_dpfp_nu} is too large for {place} attention (d_key = "
                            f"{dim_flag} {dim} / {heads_flag} {heads} = {dim // heads}); allowed: 1..{max_nu} "
                            "(2*d_key-1)")
    for place, (count, flag) in layers.items():
        rules = (getattr(args, f"fw_{place}_rule") or "").split(",")
        if len(rules) > 1 and len(rules) != count:
            raise cli_error(f"argument --fw-{place}-rule: {len(rules)} rules for {flag} {count}; allowed: one "
                            f"rule, or one per layer ({count})")
    free, cross_heads = int(args.fw_align_free_heads), shapes.get("cross", ((0, ""), (1, "")))[1]
    if free and not int(args.fw_cross_align):
        raise cli_error(f"argument --fw-align-free-heads: {free} heads free of a prior that --fw-cross-align 0 "
                        "turns off; allowed with --fw-cross-align 0: 0")
    if free >= cross_heads[0]:
        raise cli_error(f"argument --fw-align-free-heads: {free} free heads leave none of {cross_heads[1]} "
                        f"{cross_heads[0]} with the prior; allowed: 0..{cross_heads[0] - 1}")
    if args.fw_decoder_positions == "none" and "decoder" not in places:
        raise cli_error("argument --fw-decoder-positions: none needs fast-weight decoder self-attention (decoder in "
                        f"--fw-attention, here {args.fw_attention}); allowed with a softmax decoder: absolute")


def places_of(attention: str) -> FrozenSet[str]:
    """The fast-weight blocks of a canonical --fw-attention value (as its row parses it, or as a record keeps it)."""
    return frozenset(attention.split(",")) - {"none"}


def _parsed(flag, value):
    """`value` as the parser gives it from a command line: its row's choices checked, or its row's type applied to
    its text; for args that did not come through the parser (saved, or made in code)."""
    choices, kind = flag.options.get("choices"), flag.options.get("type")
    if choices is not None and value not in choices:
        raise cli_error(f"argument {flag.name}: invalid choice: {value!r} (choose from "
                        f"{', '.join(map(repr, choices))})")
    try:
        return kind(str(int(value)) if isinstance(value, bool) else str(value)) if kind else value
    except (argparse.ArgumentTypeError, ValueError) as err:
        raise cli_error(f"argument {flag.name}: {err}") from None


class _Config:
    """FastWeightConfig's methods; its fields are the flag table's (below)."""

    @classmethod
    def from_args(cls, args) -> "FastWeightConfig":
        """The config of args that an architecture filled (set_fast_weight_defaults), each value as its row parses
        it; a flag that args saved before it existed lack takes its `before`."""
        values = {flag.name: getattr(args, flag.attr) if hasattr(args, flag.attr) else flag.before for flag in FLAGS}
        values = {name: _parsed(BY_NAME[name], value) for name, value in values.items() if value is not None}
        fields = {flag.field: values[flag.name] for flag in FLAGS if flag.field and flag.name in values}
        fields["places"] = places_of(fields["places"])
        block_rules = tuple((place, values[f"--fw-{place}-rule"]) for place in PLACES if f"--fw-{place}-rule" in values)
        return cls(**fields, block_rules=block_rules)

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
        rules = tuple(dict(self.block_rules).get(place, self.update_rule).split(","))
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
        # a softmax model: no feature map or rule; what applies to softmax blocks too (the prior) is recorded
        blocks = self.blocks() if self.places else Blocks(None, (), frozenset())
        if self.places:
            out["--fw-feature-map"] = self.feature_map
            rules = {place: ",".join(self.rules(place)) for place in PLACES if place in self.places}
            if len(set(rules.values())) == 1:
                out["--fw-update-rule"] = next(iter(rules.values()))
            else:
                out.update({f"--fw-{place}-rule": rule for place, rule in rules.items()})
        for flag in FLAGS:
            if flag.recorded is not None and flag.recorded(blocks):
                out[flag.name] = flag.value(self) if flag.value else str(getattr(self, flag.field))
        return out


# A field per row with one (in the table's order, those without a `before` first: the config's positional
# arguments), defaulting to its `before`; block_rules holds the per-block rules given, (place, rule) each
FastWeightConfig = make_dataclass(
    "FastWeightConfig",
    [(flag.field, object) for flag in FLAGS if flag.field and flag.before is None]
    + [(flag.field, object, field(default=flag.before)) for flag in FLAGS if flag.field and flag.before is not None]
    + [("block_rules", Tuple[Tuple[str, str], ...], field(default=()))],
    bases=(_Config,), namespace={"__module__": __name__}, frozen=True)


def _blocks_of(settings: Dict[str, str]) -> Blocks:
    """The Blocks a settings record describes."""
    values = [settings.get(flag) for flag in ("--fw-update-rule", *(f"--fw-{p}-rule" for p in PLACES))]
    rules = [rule for value in values if value is not None for rule in value.split(",")]
    places = places_of(settings.get("--fw-attention", "none"))
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
