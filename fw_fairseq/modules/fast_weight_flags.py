"""The `--fw-*` flags' values: what each allows, parsed into the canonical form the checkpoint record keeps.

Each parser raises argparse.ArgumentTypeError, so that fairseq's parser prints the flag and the allowed
values in one line; cli_error is that line for what only several flags or a checkpoint can judge.
"""
import argparse
import math
import os
import sys
from typing import Union

from fw_fairseq.modules.output_gate import OUTPUT_GATES
from fw_fairseq.ops import RULES

UPDATE_RULES = RULES  # the live table: a rule registered before the flags parse is allowed
PLACES = ("encoder", "decoder", "cross")
BETA_MAX = 2  # --fw-delta-beta-max: beta = max * sigmoid(.), max in (0, BETA_MAX]
ALIGN_RATIO_OF_DATA = "data"  # --fw-align-ratio's value that the model's build takes from the training split


def parse_places(text: str) -> str:
    """Validate an `--fw-attention` value; return it canonical ("encoder,decoder,cross" order).

    Kept a plain string so checkpoints (which pickle the args) stay loadable with
    torch.load(weights_only=True). Raises argparse.ArgumentTypeError so that fairseq's parser
    prints the flag and the allowed values.
    """
    text = text.strip()
    if text == "none":
        return "none"
    if text == "all":
        return ",".join(PLACES)
    places = [p.strip() for p in text.split(",") if p.strip()]
    unknown = [p for p in places if p not in PLACES]
    if unknown or not places:
        raise argparse.ArgumentTypeError(
            f"--fw-attention got {text!r}; allowed: 'none', 'all' or a comma-separated "
            f"subset of {','.join(PLACES)}"
        )
    return ",".join(p for p in PLACES if p in places)


def parse_output_gate(text: str) -> str:
    """Validate an `--fw-output-gate` value, KIND or KIND:LIST (the gate in those blocks only); return it
    canonical (the LIST in encoder,decoder,cross order, none without one)."""
    kind, colon, where = text.strip().partition(":")
    try:
        places = parse_places(where) if colon else "all"
    except argparse.ArgumentTypeError:
        places = None  # not a LIST of blocks: reported below with the flag's whole syntax
    if kind not in OUTPUT_GATES or (colon and kind == "none") or places in (None, "none"):
        raise argparse.ArgumentTypeError(
            f"--fw-output-gate got {text!r}; allowed: {', '.join(OUTPUT_GATES[:-1])} or {OUTPUT_GATES[-1]}, each optionally "
            f"followed by :LIST, a comma-separated subset of {','.join(PLACES)} (e.g. channel:cross)")
    return kind if places == "all" or places == ",".join(PLACES) else f"{kind}:{places}"


def cli_error(message: str) -> SystemExit:
    """argparse's one-line exit ("fairseq-train: error: ..."), for what can be judged only once
    several flags, or a checkpoint, are known. Raise the result."""
    return SystemExit(f"{os.path.basename(sys.argv[0])}: error: {message}")


def int_at_least(flag: str, low: int):
    """The parser of an integer flag whose values are `low` or more."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{flag} got {text!r}; allowed: an integer >= {low}")
        return value

    return parse


def parse_beta_max(text: str) -> Union[int, float]:
    """A --fw-delta-beta-max value: a number in (0, 2], an integer kept as one (checkpoints record "1", "2")."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= BETA_MAX:
        raise argparse.ArgumentTypeError(f"--fw-delta-beta-max got {text!r}; allowed: a number in (0, {BETA_MAX}]")
    return int(value) if value.is_integer() else value


def parse_rule(flag: str):
    """Validate a `--fw-{place}-rule` value: a rule, or a comma-separated rule per layer (`sum,delta`: the first
    layer's block the sum rule, the second's the delta rule). Kept as listed, so that the architecture can check
    the count against the layers; the record spells it canonical (FastWeightConfig.rules)."""
    def parse(text: str) -> str:
        rules = text.replace(" ", "").split(",")
        for rule in rules:
            if rule not in UPDATE_RULES:
                raise argparse.ArgumentTypeError(f"{flag} got {text!r}; allowed: {', '.join(UPDATE_RULES)}, "
                                                 "or one of them per layer, comma-separated")
        return ",".join(rules)

    return parse


def parse_encoder_conv(text: str) -> int:
    """Validate an `--fw-encoder-conv` width: 0 (no convolution) or an odd K >= 3 (centred on the position)."""
    try:
        width = int(text)
    except ValueError:
        width = -1
    if width != 0 and (width < 3 or width % 2 == 0):
        raise argparse.ArgumentTypeError(f"--fw-encoder-conv got {text!r}; allowed: 0 (off) or an odd width >= 3")
    return width


def parse_align_ratio(text: str) -> Union[float, str]:
    """An `--fw-align-ratio` value: a number > 0 (kept as a float; the record spells it %g), or `data`, which the
    model's build replaces by the training split's ratio (models/transformer_fw.py, settle_align_ratio)."""
    if text.strip() == ALIGN_RATIO_OF_DATA:
        return ALIGN_RATIO_OF_DATA
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"--fw-align-ratio got {text!r}; allowed: a number > 0, or "
                                         f"{ALIGN_RATIO_OF_DATA} (the training split's target over source tokens)")
    return value


def parse_switch(flag: str):
    """A flag that is on given alone or as 1, off as 0 (its absence: its preset's value)."""
    def parse(text: str) -> bool:
        if text.strip() not in ("0", "1"):
            raise argparse.ArgumentTypeError(f"{flag} got {text!r}; allowed: 0 or 1 (alone: 1)")
        return text.strip() == "1"

    return parse
