#!/usr/bin/env python3
"""Average the model weights of several fairseq checkpoints (fairseq-fixed ships no scripts/).

    fw_research.wmt14.average_checkpoints --inputs SAVE_DIR --num-epoch-checkpoints 5 --output avg.pt
    fw_research.wmt14.average_checkpoints --inputs a.pt b.pt c.pt --output avg.pt

Floating-point tensors are averaged (in float64, stored back in their own dtype). As in
fairseq's script, the first input (with -n: the newest epoch) is the base: integer tensors
(counters, the record of the --fw-* settings) and the FAVOR+ random projections are copied
from it rather than averaged, the projections because they are redrawn at every training
step, so that their average is a matrix no layer was ever trained with (--keep-newest sets
the pattern). Its cfg and args stay so that fairseq-generate can load the result; its
optimizer state is dropped, since it belongs to none of the averaged models. Checkpoints
whose attention differs (--fw-feature-map, --fw-dpfp-nu, ...) are refused: their parameters
may have the same shapes, but the average fits neither attention.
"""
import argparse
import re
import sys
from pathlib import Path

import torch

from fw_fairseq.models.checkpoints import NOT_AVERAGED, RECORD, decode
from fw_fairseq.modules.fast_weight_config import FastWeightConfig, with_later_flags

_EPOCH_CKPT = re.compile(r"checkpoint(\d+)\.pt")


def epoch_checkpoints(directory, n, upper_bound=None):
    """The last n checkpoint<epoch>.pt of a directory (at most epoch upper_bound), newest first."""
    found = []
    for path in Path(directory).iterdir():
        match = _EPOCH_CKPT.fullmatch(path.name)
        if match and (upper_bound is None or int(match.group(1)) <= upper_bound):
            found.append((int(match.group(1)), path))
    if len(found) < n:
        raise ValueError(f"{directory} has {len(found)} epoch checkpoints, {n} requested")
    return [path for _, path in sorted(found, reverse=True)[:n]]


def load(path):
    # fairseq checkpoints hold argparse.Namespace / omegaconf objects: weights_only=False is
    # needed, and acceptable only because these are checkpoints we trained ourselves.
    return torch.load(path, map_location="cpu", weights_only=False)


def attention_settings(state):
    """The --fw-* flags that decide what a checkpoint's attention computes (None: not one of the
    plugin's models); from its record, or from its args if it predates the record."""
    if RECORD in state["model"]:  # a record older than a flag holds the value models had before it
        return with_later_flags(decode(state["model"][RECORD]))
    args = (state.get("cfg") or {}).get("model") or state.get("args")
    if getattr(args, "fw_feature_map", None) is None:
        return None
    return FastWeightConfig.from_args(args).settings()


def check_same_attention(path, state, base_path, base):
    found = attention_settings(state)
    flags = [flag for flag in base or {} if flag in (found or {}) and found[flag] != base[flag]]
    if flags:
        raise ValueError(f"{path} was trained with {' '.join(f'{f} {found[f]}' for f in flags)}, "
                         f"{base_path} with {' '.join(f'{f} {base[f]}' for f in flags)}")


def average(paths, keep_newest=NOT_AVERAGED.pattern):
    """Average the "model" state dicts of `paths`; return the first state holding the average."""
    keep = re.compile(keep_newest)
    newest = load(paths[0])
    model = newest["model"]
    settings = attention_settings(newest)
    sums = {k: v.to(torch.float64) for k, v in model.items() if v.is_floating_point() and not keep.search(k)}
    for path in paths[1:]:
        state = load(path)
        check_same_attention(path, state, paths[0], settings)
        other = state["model"]
        if other.keys() != model.keys():
            raise ValueError(f"{path} has different parameters from {paths[0]}")
        for k in sums:
            if other[k].shape != model[k].shape:
                raise ValueError(f"{k}: shape {tuple(other[k].shape)} in {path}, {tuple(model[k].shape)} in {paths[0]}")
            sums[k] += other[k].to(torch.float64)
    for k, total in sums.items():
        model[k] = (total / len(paths)).to(model[k].dtype)
    newest["last_optimizer_state"] = None
    return newest


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", nargs="+", required=True, help="checkpoint files, or one directory with -n")
    p.add_argument("--output", required=True)
    p.add_argument("-n", "--num-epoch-checkpoints", type=int, help="average the last N checkpoint<epoch>.pt")
    p.add_argument("--checkpoint-upper-bound", type=int, help="ignore epochs after this one")
    p.add_argument("--keep-newest", default=NOT_AVERAGED.pattern,
                   help="regex of parameter names copied from the first input, not averaged")
    args = p.parse_args(argv)

    try:
        if args.num_epoch_checkpoints:
            if len(args.inputs) != 1 or not Path(args.inputs[0]).is_dir():
                raise ValueError("--num-epoch-checkpoints needs exactly one directory in --inputs")
            paths = epoch_checkpoints(args.inputs[0], args.num_epoch_checkpoints, args.checkpoint_upper_bound)
        else:
            paths = [Path(x) for x in args.inputs]
        state = average(paths, args.keep_newest)
    except (ValueError, OSError) as err:
        sys.exit(f"average_checkpoints: {err}")
    torch.save(state, args.output)
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {args.output}")


if __name__ == "__main__":
    main()
