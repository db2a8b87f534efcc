#!/usr/bin/env python3
"""The conversion recipe in one command (docs/converting.md): convert a softmax checkpoint, distil its attention for N
updates (into the learned feature maps, or with --distil-trains projections through the blocks' q, k and beta
projections), fine-tune the whole model for M updates, and score both models with sacreBLEU.

    convert_recipe.py --teacher checkpoints/checkpoint_best.pt --data data-bin --work-dir convert_work \
        --distil-updates 200 --finetune-updates 200 --fw-feature-map t2r --fw-t2r-features 32

Fine-tuning trains with label-smoothed cross-entropy, or with --criterion fw_unlikelihood where the converted model
has the aligned read of the source (the criterion that read was measured with: the translation defaults).

Each step writes into --work-dir and is skipped when its output is there: converted.pt, distil/ and finetune/ (whose
fairseq-train resumes from its checkpoint_last.pt when run again; a step whose checkpoint_last.pt has its updates is
done), and {teacher,student}.score (sacreBLEU of fairseq-generate's test split after --post-process: BPE removed,
tokenised as the data-bin is). The student's architecture and dims are the converted checkpoint's, passed to fairseq-train as
flags; --train-args adds flags to both trainings (e.g. "--max-tokens 2048 --cpu"; --max-tokens 4096 otherwise).
"""
import argparse
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import sacrebleu
import torch

import fw_fairseq  # noqa: F401  (the models, the criterion, the safe globals for torch.load)
from fairseq.models import ARCH_MODEL_REGISTRY

from fw_fairseq.models.transformer_fw import criterion_warning
from fw_fairseq.modules.fast_weight_config import FastWeightConfig, add_fast_weight_args
from fw_fairseq.modules.flag_table import FLAGS
from fw_research.experiments.attention_runs import updates_done

REPO = Path(__file__).resolve().parents[3]
BIN = Path(sys.executable).parent
# Adam's rate for the distillation, per --distil-trains: the maps' new parameters move fast; the projections start as
# the teacher's and are what fine-tuning trains at 5e-4 to 1e-3
DISTIL_LR = {"maps": 1e-2, "projections": 1e-3}


def parse(argv):
    parser = argparse.ArgumentParser(prog="convert_recipe.py", description=__doc__.split("\n")[0])
    parser.add_argument("--teacher", required=True, type=Path, metavar="CKPT", help="the softmax checkpoint")
    parser.add_argument("--data", required=True, type=Path, metavar="DIR", help="the teacher's data-bin")
    parser.add_argument("--work-dir", required=True, type=Path)
    parser.add_argument("--distil-updates", type=int, default=200, metavar="N")
    parser.add_argument("--finetune-updates", type=int, default=200, metavar="M")
    parser.add_argument("--distil-trains", choices=list(DISTIL_LR), default="maps",
                        help="what the distillation trains: maps (T2R, trainable Hedgehog), or projections (each "
                             "block's q, k and beta: a map without parameters, e.g. the defaults' DPFP)")
    parser.add_argument("--distil-lr", type=float, help="Adam's rate for the distillation (default 1e-2 for maps, "
                                                        "1e-3 for projections)")
    parser.add_argument("--lr", type=float, default=5e-4, help="fine-tuning's Adam rate (default 5e-4)")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--post-process", default="subword_nmt", help="fairseq-generate's (default subword_nmt)")
    parser.add_argument("--train-args", default="", help="more fairseq-train flags for both trainings")
    add_fast_weight_args(parser)
    args = parser.parse_args(argv)
    # the commands run in the repository (fairseq's --user-dir): the paths given are taken as the caller meant them
    args.teacher, args.data, args.work_dir = (Path(x).resolve() for x in (args.teacher, args.data, args.work_dir))
    args.distil_lr = DISTIL_LR[args.distil_trains] if args.distil_lr is None else args.distil_lr
    for flag in ("--distil-updates", "--finetune-updates", "--beam"):
        if getattr(args, flag[2:].replace("-", "_")) < 1:
            parser.error(f"argument {flag}: allowed: an integer >= 1")
    return args


def run(cmd, log):
    """Run a command, its output into `log`; one line naming the step and the log where it fails."""
    with open(log, "w") as out:
        done = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
    if done.returncode:
        tail = Path(log).read_text().strip().splitlines()[-1:] or [""]
        # a module run (python -m NAME) is named by its module, a CLI by its file
        step = cmd[2] if cmd[:2] == [sys.executable, "-m"] else Path(cmd[0]).name
        raise SystemExit(f"convert_recipe.py: error: {step} failed ({log}): {tail[0][:200]}")


def model_flags(model_args):
    """The converted model's args as fairseq-train flags: every option its model class registers, valued."""
    parser = argparse.ArgumentParser()
    ARCH_MODEL_REGISTRY[model_args.arch].add_args(parser)
    flags = ["--arch", model_args.arch]
    for action in parser._actions:
        value = getattr(model_args, action.dest, None)
        if not action.option_strings or value is None or action.dest == "help":
            continue
        if isinstance(action, argparse._StoreTrueAction):
            flags += [action.option_strings[0]] if value else []
        else:
            text = str(int(value)) if isinstance(value, bool) else str(value)
            flags += [action.option_strings[0], text]
    return flags


def finetune_criterion(model_args):
    """label_smoothed_cross_entropy's flags, or fw_unlikelihood's where the model trains the aligned read of the
    source (which fw_fairseq.models.transformer_fw.criterion_warning would warn about without it)."""
    plain = argparse.Namespace(**{**vars(model_args), "criterion": "label_smoothed_cross_entropy"})
    aligned = criterion_warning(plain, FastWeightConfig.from_args(model_args)) is not None
    return ["--criterion", "fw_unlikelihood" if aligned else plain.criterion, "--label-smoothing", "0.1"]


def distil_criterion(trains, converted, lr):
    """fw_attention_distillation's flags: what it trains, the converted file as the teacher where the projections
    train, Adam's rate."""
    teacher = ["--distil-teacher", converted] if trains == "projections" else []
    return ["--criterion", "fw_attention_distillation", "--distil-trains", trains, *teacher, "--lr", str(lr)]


def criterion_flags(args, model_args, stage):
    if stage == "finetune":
        return [*finetune_criterion(model_args), "--lr", str(args.lr)]
    return distil_criterion(args.distil_trains, args.work_dir / "converted.pt", args.distil_lr)


def train(args, model_args, start, save_dir, updates, stage):
    """fairseq-train of the converted model (its args `model_args`) from `start` (--finetune-from-model: a re-run
    resumes from save_dir's checkpoint_last.pt)."""
    if updates_done(save_dir) >= updates:
        return
    save_dir.mkdir(parents=True, exist_ok=True)
    model, criterion = model_flags(model_args), criterion_flags(args, model_args, stage)
    run([BIN / "fairseq-train", args.data, "--user-dir", REPO / "fw_fairseq", *model, *criterion,
         "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--max-update", str(updates),
         "--finetune-from-model", start, "--save-dir", save_dir, "--no-epoch-checkpoints", "--max-tokens", "4096",
         *shlex.split(args.train_args)], args.work_dir / f"{stage}.log")


def score(args, checkpoint, name):
    """Corpus BLEU of `checkpoint` on the test split, kept in {name}.score (json)."""
    out = args.work_dir / f"{name}.score"
    if out.is_file():
        return json.loads(out.read_text())
    log = args.work_dir / f"{name}.generate"
    cpu = ["--cpu"] if "--cpu" in shlex.split(args.train_args) else []
    run([BIN / "fairseq-generate", args.data, "--user-dir", REPO / "fw_fairseq", "--path", checkpoint,
         "--beam", str(args.beam), "--post-process", args.post_process, "--max-tokens", "4096", *cpu], log)
    lines = log.read_text().splitlines()
    hyps = {int(m[1]): m[2] for m in (re.match(r"D-(\d+)\t[^\t]*\t(.*)", line) for line in lines) if m}
    refs = {int(m[1]): m[2] for m in (re.match(r"T-(\d+)\t(.*)", line) for line in lines) if m}
    ids = sorted(refs)
    bleu = sacrebleu.corpus_bleu([hyps.get(i, "") for i in ids], [[refs[i] for i in ids]])
    result = {"checkpoint": str(checkpoint), "bleu": round(bleu.score, 2), "sentences": len(ids)}
    out.write_text(json.dumps(result) + "\n")
    return result


def main(argv):
    args = parse(argv)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    converted = args.work_dir / "converted.pt"
    if not converted.is_file():
        fw = [arg for flag in FLAGS if getattr(args, flag.attr) is not None
              for arg in (flag.name, str(int(getattr(args, flag.attr))) if isinstance(getattr(args, flag.attr), bool)
                          else str(getattr(args, flag.attr)))]
        run([sys.executable, "-m", "fw_research.convert.convert_softmax", "--from", args.teacher,
             "--to", converted, "--data", args.data, *fw], args.work_dir / "convert.log")
    model_args = torch.load(converted, map_location="cpu", weights_only=False)["cfg"]["model"]
    train(args, model_args, converted, args.work_dir / "distil", args.distil_updates, "distil")
    train(args, model_args, args.work_dir / "distil" / "checkpoint_last.pt", args.work_dir / "finetune",
          args.finetune_updates, "finetune")
    for name, checkpoint in (("teacher", args.teacher), ("student", args.work_dir / "finetune" / "checkpoint_last.pt")):
        print(f"{name}: BLEU {score(args, checkpoint, name)['bleu']} ({checkpoint})")


if __name__ == "__main__":
    main(sys.argv[1:])
