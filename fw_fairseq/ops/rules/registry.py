"""The table of update rules (RULES: name -> UpdateRule) and `register_rule`, the one way a rule joins it.

The attention module's flags (--fw-update-rule, --fw-{place}-rule), the checkpoint records, the synthetic task
and the benchmarks read the table; a rule registered before they parse or build is theirs like the shipped ones.
"""
from fw_fairseq.ops.rules.delta.record import DELTA, DELTA_Z, GATED_DELTA
from fw_fairseq.ops.rules.record import UpdateRule
from fw_fairseq.ops.rules.sum.record import SUM

RULES = {}


def register_rule(rule):
    """Adds `rule` (an UpdateRule) to RULES under its name and returns it. A rule needs its reference loop and
    its causal form; its scalars each need a pad value; a name is registered once."""
    if not isinstance(rule, UpdateRule):
        raise TypeError(f"register_rule: expected an UpdateRule, got {type(rule).__name__}")
    if not rule.name.isidentifier() or rule.name in RULES:
        raise ValueError(f"register_rule: the name {rule.name!r} is taken or not an identifier; taken: "
                         f"{', '.join(RULES)}")
    missing = [name for name in rule.scalars if name not in rule.pad_values]
    if missing or rule.naive is None or rule.chunked is None:
        raise ValueError(f"register_rule: rule {rule.name!r} needs its naive and chunked forms and a pad value for "
                         f"each scalar (missing: {', '.join(missing) or 'none'})")
    RULES[rule.name] = rule
    return rule


def rule_with(fn, scalars):
    """The registered rule whose scalars are the given ones ({name: tensor or None}; None: not given), and those
    scalars in its order: the public ops that take beta and alpha by keyword find their rule this way."""
    given = tuple(name for name, x in scalars.items() if x is not None)
    for rule in RULES.values():
        if rule.scalars == given:
            return rule, {name: scalars[name] for name in given}
    for rule in RULES.values():  # given scalars that a rule takes with others: name what is missing
        if set(given) < set(rule.scalars):
            missing = ", ".join(name for name in rule.scalars if name not in given)
            raise ValueError(f"{fn}: {', '.join(given)} needs {missing} (update rule {rule.name!r} takes "
                             f"{', '.join(rule.scalars)})")
    allowed = "; ".join(f"{rule.name}: {', '.join(rule.scalars) or 'none'}" for rule in RULES.values())
    raise ValueError(f"{fn}: no update rule takes the scalars ({', '.join(given)}); the rules take {allowed}")


for _rule in (SUM, DELTA, GATED_DELTA, DELTA_Z):
    register_rule(_rule)
