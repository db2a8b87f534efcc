#!/usr/bin/env python3
"""Convert a trained softmax Transformer checkpoint into a fast-weight one (docs/converting.md).

    convert_softmax.py --from checkpoints/checkpoint_best.pt --to fw/converted.pt [--data data-bin] \
        --fw-feature-map t2r --fw-t2r-features 32 --fw-update-rule sum --fw-decoder-rule sum

The teacher is a fairseq `transformer`-family checkpoint (transformer, transformer_wmt_en_de_big,
transformer_vaswani_wmt_en_de_big, ..., or a transformer_fw* with --fw-attention none). The result is a
transformer_fw* checkpoint with the teacher's dims whose args carry the given --fw-* flags (the rest at their
defaults) and whose settings record names the teacher ("converted-from"). Every teacher parameter is copied
(embeddings, FFNs, norms, the q/k/v/out projections of every block); the parameters fast weights add start as close
to the teacher as they can: the encoder's convolution at zero (it adds nothing), the output gate open (weights 0,
bias GATE_BIAS_INIT: sigma = 0.993), beta and alpha as the flags set them, the learned maps at their own
initialisation (T2R's random features, trainable Hedgehog's identity). It loads in
`fairseq-train --restore-file OUT --reset-optimizer --reset-dataloader --reset-meters --reset-lr-scheduler` and in
fairseq-generate. Anything it cannot map stops with one line naming it.
"""
import argparse
import copy
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

import fw_fairseq  # noqa: F401  (registers the models, the safe globals, the one-line checkpoint loader)
from fairseq import checkpoint_utils
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
from fairseq.models.transformer import TransformerModel
from omegaconf import OmegaConf, open_dict

from fw_fairseq.models.transformer_fw import FastWeightTransformerModel
from fw_fairseq.modules.fast_weight_config import FastWeightConfig, add_fast_weight_args
from fw_fairseq.modules.flag_table import FLAGS, GATE_BIAS_INIT

PROG = "convert_softmax.py"
# the fast-weight architecture of each softmax one: the big models keep the big defaults (their args carry the
# dims anyway); other architectures of fairseq's TransformerModel map to transformer_fw
FW_ARCH = {"transformer": "transformer_fw", "transformer_wmt_en_de": "transformer_fw",
           "transformer_wmt_en_de_big": "transformer_fw_big", "transformer_vaswani_wmt_en_de_big": "transformer_fw_big",
           "transformer_fw": "transformer_fw", "transformer_fw_big": "transformer_fw_big",
           "transformer_fw_small": "transformer_fw_small"}


def fail(message):
    raise SystemExit(f"{PROG}: error: {message}")


def parse(argv):
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source", required=True, metavar="CKPT", help="the softmax checkpoint")
    parser.add_argument("--to", dest="target", required=True, metavar="OUT", help="the converted checkpoint")
    parser.add_argument("--data", metavar="DIR", help="the data-bin the model will train on: its dictionaries "
                        "must have the teacher's sizes (checked where given)")
    add_fast_weight_args(parser)
    args = parser.parse_args(argv)
    if args.fw_attention == "none":
        parser.error("argument --fw-attention: none converts nothing; allowed: all or a comma list of "
                     "encoder,decoder,cross")
    return args


def teacher_args(state, path):
    """The teacher's model args (a Namespace: fairseq's legacy transformers keep their args as one)."""
    model = state["cfg"].get("model") if state.get("cfg") is not None else None
    if not isinstance(model, argparse.Namespace):
        fail(f"{path}: no model args of a fairseq transformer (cfg.model is {type(model).__name__}); allowed: a "
             f"checkpoint of {', '.join(sorted(FW_ARCH))} or another fairseq TransformerModel architecture")
    return model


def student_arch(args, path):
    """The fast-weight architecture of the teacher's, or one line saying why there is none."""
    arch = args.arch
    model = ARCH_MODEL_REGISTRY.get(arch)
    if model is FastWeightTransformerModel and getattr(args, "fw_attention", "none") != "none":
        fail(f"{path} has fast weights already (--fw-attention {args.fw_attention}); allowed: a softmax model "
             f"(transformer_fw* only with --fw-attention none)")
    if arch in FW_ARCH:
        return FW_ARCH[arch]
    if model is TransformerModel:
        return "transformer_fw"
    fail(f"{path}: architecture {arch!r} cannot be converted; allowed: {', '.join(sorted(FW_ARCH))} or another "
         f"fairseq TransformerModel architecture")


def student_args(teacher, arch, flags):
    """The teacher's args with the fast-weight arch and the given --fw-* flags (the family's defaults for the rest,
    as fairseq-train gives them with the same flags), checked as fairseq's parser checks them (heads, DPFP nu: one
    line)."""
    args = copy.deepcopy(teacher)
    for flag in FLAGS:
        setattr(args, flag.attr, getattr(flags, flag.attr))
    args.arch = args._name = arch
    ARCH_CONFIG_REGISTRY[arch](args)  # the family's defaults and check_shapes' one-line errors
    return args


def rows(weights, name):
    return weights[name].shape[0] if name in weights else None


def data_langs(teacher, data):
    """{"source": src, "target": tgt}: the teacher's -s/-t, else the pair of the data-bin's train files
    (train.SRC-TGT.SRC.idx), as fairseq's translation task infers them."""
    langs = {"source": getattr(teacher, "source_lang", None), "target": getattr(teacher, "target_lang", None)}
    if data is None or None not in langs.values():
        return langs
    pairs = {path.name.split(".")[1] for path in Path(data).glob("train.*-*.*.idx")}
    if len(pairs) != 1:
        fail(f"--data {data}: cannot tell the language pair (train files of {sorted(pairs) or 'no pair'}); "
             f"allowed: a data-bin of one pair")
    source, target = next(iter(pairs)).split("-")
    return {"source": source, "target": target}


def dictionaries(weights, teacher, data, path):
    """Dictionaries of the teacher's sizes (all a model build reads of them); with --data, the data-bin's own,
    refused where their sizes differ from the teacher's embeddings."""
    sizes = {side: rows(weights, f"{coder}.embed_tokens.weight") for side, coder in (("source", "encoder"),
                                                                                    ("target", "decoder"))}
    if None in sizes.values():
        fail(f"{path}: no encoder.embed_tokens.weight or decoder.embed_tokens.weight; allowed: a translation model")
    langs = data_langs(teacher, data)
    out = {}
    for side, size in sizes.items():
        if data is None:
            out[side] = Dictionary()
            while len(out[side]) < size:
                out[side].add_symbol(f"<converted{len(out[side])}>")
            continue
        file = Path(data) / f"dict.{langs[side]}.txt"
        if not file.is_file():
            fail(f"--data {data}: no {file.name} (the teacher's {side} language {langs[side]!r})")
        out[side] = Dictionary.load(str(file))
        if len(out[side]) != size:
            fail(f"--data {data}: {file.name} has {len(out[side])} entries, the teacher's {side} embeddings "
                 f"{size}: not the dictionary it was trained with")
    return SimpleNamespace(source_dictionary=out["source"], target_dictionary=out["target"])


def start_new_parameter(name, tensor):
    """A parameter the teacher lacks, as close to the teacher as it can start (in place)."""
    if ".encoder_conv." in name or ".decoder_conv." in name:
        tensor.zero_()  # the convolution adds nothing: the block reads what the attention reads
    elif ".output_gate.proj." in name:
        tensor.fill_(GATE_BIAS_INIT if name.endswith(".bias") else 0.0)  # sigma(5) = 0.993: the gate open


def copy_weights(student, weights, path):
    """Copy every teacher tensor into the student, refusing one it lacks or whose shape differs."""
    mine = student.state_dict()  # tensors sharing the parameters' storage: copy_ writes the model
    missing = [name for name in weights if name not in mine]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        fail(f"{path}: the fast-weight model has no {missing[0]}{more}: the teacher has parts the conversion "
             f"cannot map")
    with torch.no_grad():
        for name, tensor in weights.items():
            if mine[name].shape != tensor.shape:
                fail(f"{path}: {name} is {tuple(tensor.shape)} in the teacher, {tuple(mine[name].shape)} in the "
                     f"fast-weight model: dims or heads the conversion cannot map")
            mine[name].copy_(tensor)
        for name in set(mine) - set(weights):
            start_new_parameter(name, mine[name])


def converted_state(state, args, student):
    """The checkpoint to write: the teacher's config with the student's args, the student's weights, no optimizer
    state and no progress (fairseq-train starts it with --reset-optimizer --reset-dataloader ...)."""
    cfg = state["cfg"]
    with open_dict(cfg):
        cfg.model = args
    history = state["optimizer_history"][-1]
    return {"args": None, "cfg": OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
            "model": student.state_dict(), "criterion": None,
            "optimizer_history": [{"criterion_name": history.get("criterion_name", "CrossEntropyCriterion"),
                                   "optimizer_name": history.get("optimizer_name", "FairseqAdam"),
                                   "lr_scheduler_state": {}, "num_updates": 0}],
            "task_state": {}, "extra_state": {"train_iterator": {"epoch": 1}}, "last_optimizer_state": None}


def convert(argv):
    flags = parse(argv)
    if not os.path.isfile(flags.source):
        fail(f"--from {flags.source}: no such file")
    state = checkpoint_utils.load_checkpoint_to_cpu(flags.source)  # the plugin's one-line refusal of a bad file
    teacher = teacher_args(state, flags.source)
    arch = student_arch(teacher, flags.source)
    args = student_args(teacher, arch, flags)
    weights = {name: tensor for name, tensor in state["model"].items() if name != "fw_settings"}
    task = dictionaries(weights, teacher, flags.data, flags.source)
    student = ARCH_MODEL_REGISTRY[arch].build_model(args, task)
    copy_weights(student, weights, flags.source)
    student.record_fast_weight_settings(FastWeightConfig.from_args(args).settings(),
                                        converted_from=f"{teacher.arch} ({flags.source})")
    os.makedirs(os.path.dirname(os.path.abspath(flags.target)), exist_ok=True)
    torch.save(converted_state(state, args, student), flags.target)
    settings = FastWeightConfig.from_args(args).settings()
    print(f"{flags.source} ({teacher.arch}) -> {flags.target} ({arch}: "
          f"{' '.join(f'{flag} {value}' for flag, value in settings.items())})")


if __name__ == "__main__":
    convert(sys.argv[1:])
