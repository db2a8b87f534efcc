"""--fw-align-ratio data: the aligned cross-attention's length ratio counted from the training split, once, when a
translation model is built for training. The number replaces `data` in the model's args, so that the checkpoint
keeps it and every later build (resuming, fairseq-generate) reads the number, not the data."""
import numpy as np

from fw_fairseq.modules.fast_weight_flags import ALIGN_RATIO_OF_DATA, cli_error


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
    """Replace --fw-align-ratio data in args by the training split's ratio (args of a translation model, filled by
    its architecture); a number stays as it is."""
    if str(getattr(args, "fw_align_ratio", None)) == ALIGN_RATIO_OF_DATA:
        args.fw_align_ratio = training_length_ratio(args, task)
