"""What a checkpoint of the plugin's models must carry, and how fairseq reads it.

- Every state dict holds `fw_settings`, the `--fw-*` flags that decide what the attention
  computes (a uint8 buffer of JSON). A checkpoint trained with DPFP-1 loads without complaint
  into an ELU model (the parameters have the same shapes), and softmax and fast-weight blocks
  share parameter names; so loading compares the records and refuses a difference.
- A model converted from a softmax checkpoint (`python -m fw_research.convert.convert_softmax`) carries one more
  entry in the record, CONVERTED ("transformer_vaswani_wmt_en_de_big (teacher.pt)"): not a flag, so never compared;
  loading keeps it in the model's record, so that every checkpoint trained from the conversion says where it came from.
- fairseq-fixed reads checkpoints with torch.load and shows torch's message on failure, which
  for a damaged file says to re-run with weights_only=False; the loader is wrapped so that a
  damaged file is named as such in one line.
- fairseq's `--store-ema` averages every state-dict entry but "version" keys; FAVOR+
  projections are random draws, not weights, and the record is not a number: both are copied
  from the model instead.
"""
import json
import logging
import pickle
import re
import traceback
from typing import Dict, Optional

import torch

from fairseq import checkpoint_utils, trainer

from fw_fairseq.modules.fast_weight_config import per_block_rules, with_later_flags
from fw_fairseq.modules.fast_weight_flags import cli_error
from fw_fairseq.modules.flag_table import BY_NAME

logger = logging.getLogger(__name__)

RECORD = "fw_settings"
CONVERTED = "converted-from"  # the record's entry naming a converted model's softmax teacher: "ARCH (FILE)"
# State-dict entries that are not weights: copied from the newest model, never averaged.
NOT_AVERAGED = re.compile(rf"(^|\.)favor\.projection$|^{RECORD}$")


def encode(settings: Dict[str, str]) -> torch.Tensor:
    return torch.tensor(list(json.dumps(settings).encode()), dtype=torch.uint8)


def decode(record: torch.Tensor) -> Dict[str, str]:
    return json.loads(bytes(record.cpu().tolist()).decode())


def differences(found: Dict[str, str], wanted: Dict[str, str]) -> str:
    """"--fw-feature-map dpfp, not elu" for each flag whose values differ ('' if none). A flag
    that applies on one side only (--fw-dpfp-nu) follows from a flag that differs. Rules recorded
    as --fw-update-rule on one side and per block on the other are compared per block."""
    if ("--fw-update-rule" in found) != ("--fw-update-rule" in wanted):
        found, wanted = per_block_rules(found), per_block_rules(wanted)
    return "; ".join(f"{flag} {found[flag]}, not {value}" for flag, value in wanted.items()
                     if flag in found and found[flag] != value)


class RecordsFastWeightSettings:
    """Mixed into the plugin's fairseq models (before the fairseq base class)."""

    def record_fast_weight_settings(self, settings: Dict[str, str], converted_from: Optional[str] = None):
        """The record of the model's settings (FastWeightConfig.settings), and of the softmax model it was converted
        from where it was."""
        extra = {} if converted_from is None else {CONVERTED: converted_from}
        self.register_buffer(RECORD, encode({**settings, **extra}))

    def converted_from(self) -> Optional[str]:
        """"ARCH (FILE)" of the softmax checkpoint this model was converted from, None where it was not."""
        return decode(getattr(self, RECORD)).get(CONVERTED)

    def load_state_dict(self, state_dict, strict=True, model_cfg=None, args=None):
        wanted = {flag: value for flag, value in decode(getattr(self, RECORD)).items() if flag != CONVERTED}
        stored = state_dict.get(RECORD)
        if stored is None:
            logger.warning("the checkpoint predates the record of its --fw-* settings; "
                           "they cannot be checked: load it with the flags it was trained with")
            state_dict[RECORD] = getattr(self, RECORD).clone()
        else:
            record = with_later_flags(decode(stored))
            unknown = [flag for flag in wanted if flag in BY_NAME and BY_NAME[flag].recorded and flag not in record]
            if unknown:
                logger.warning("the checkpoint's record predates %s: not checked; load it with the values it was "
                               "trained with", ", ".join(unknown))
            found = differences(record, wanted)
            if found:
                source = getattr(stored, "fw_source", "the checkpoint")
                raise cli_error(f"{source} was trained with {found} (its weights fit only "
                                f"that attention: load it with the flags it was trained with)")
            if CONVERTED in record:  # kept, so that the next checkpoint says it too (a buffer of another length)
                device = getattr(self, RECORD).device
                self.register_buffer(RECORD, encode({**wanted, CONVERTED: record[CONVERTED]}).to(device))
            # the same settings, perhaps recorded before a flag was (a buffer of another length)
            state_dict[RECORD] = getattr(self, RECORD).clone()
        return super().load_state_dict(state_dict, strict, model_cfg, args)


_TORCH_LOAD_FILES = {torch.serialization.__file__, torch._weights_only_unpickler.__file__}


def _raised_by_torch_load(err: BaseException) -> bool:
    return any(frame.filename in _TORCH_LOAD_FILES
               for frame in traceback.extract_tb(err.__traceback__))


_fairseq_load_checkpoint_to_cpu = checkpoint_utils.load_checkpoint_to_cpu


def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
    """fairseq's loader, with one line instead of torch's advice when the file cannot be read;
    tags the settings record with the file's name for the refusal above."""
    try:
        state = _fairseq_load_checkpoint_to_cpu(path, arg_overrides, load_on_all_ranks)
    except Exception as err:  # noqa: B902  (torch raises anything from a damaged pickle)
        if not _raised_by_torch_load(err):
            raise
        unsupported = re.search(r"Unsupported global: GLOBAL (\S+)", str(err))
        if unsupported and isinstance(err, pickle.UnpicklingError):
            raise cli_error(f"{path} holds {unsupported.group(1)}, which torch does not load "
                            f"without weights_only=False: a corrupt file, or a checkpoint of "
                            f"another plugin (pass its --user-dir)") from None
        # torch's weights-only message buries the unpickler's own words under its advice
        cause = re.search(r"WeightsUnpickler error: (.*)", str(err))
        detail = cause.group(1) if cause else (str(err).strip().splitlines() or [""])[0]
        raise cli_error(f"{path} is corrupt or truncated (torch.load: {type(err).__name__}"
                        f"{': ' + detail[:120] if detail else ''})") from None
    model = state.get("model") if isinstance(state, dict) else None
    if isinstance(model, dict) and RECORD in model:
        model[RECORD].fw_source = str(path)  # a tensor attribute: it leaves with the tensor
    return state


_fairseq_build_ema = trainer.build_ema


def build_ema(model, cfg, device):
    """fairseq's EMA of the trainer, copying rather than averaging what is not a weight."""
    ema = _fairseq_build_ema(model, cfg, device)
    ema.skip_keys |= {key for key in model.state_dict() if NOT_AVERAGED.search(key)}
    return ema


# fairseq reads both through module attributes at call time (trainer.build_ema: the name the
# trainer imported), so these are the only places to change.
checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu
trainer.build_ema = build_ema
