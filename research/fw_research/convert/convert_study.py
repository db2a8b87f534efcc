"""Converting a trained softmax model against training from scratch, at equal updates, on the German catalogs.

    python -m fw_research.convert.convert_study [--teacher-updates 2000] [--totals 200 400] [--seeds 1 2 3]

1. The teacher: the comparison's `softmax` row (its preset, `demo` unless --preset), trained --teacher-updates.
2. For every configuration (CONFIGS) and total T of --totals, the teacher converted (convert_softmax.py), then
   - fine-tuned T updates;
   - where CONFIGS names a distillation: its attention distilled for T / 4 updates (--criterion
     fw_attention_distillation: the maps alone where they have parameters, T2R and trainable Hedgehog; else the
     blocks' q, k and beta projections, against the converted checkpoint's), then fine-tuned T - T / 4: the
     distillation's updates count toward the total.
3. The same configuration trained from scratch for T updates with the comparison's flags.
4. The control: the teacher trained T more updates with the fine-tuning's schedule (softmax, "continued").

Every model translates the test split as the comparison does (beam 4, detokenised sacreBLEU); its valid loss is the
last validation of its (last) training; decoding speed is fairseq-generate's tokens/s on the test split, beside the
teacher's. Each step is kept in --work-dir ({preset}-convert/, beside the comparison's corpus {preset}/) and skipped
when run again. Writes results/convert_study/{preset}.json, .md (the table, by convert_report.py) and .png (BLEU
against total updates), every run of every seed, and the table's means over the seeds.
"""
import argparse
import json
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

from fw_research.convert.convert_recipe import DISTIL_LR, distil_criterion
from fw_research.convert.convert_report import write
from fw_research.experiments import attention_runs, catalog_corpus
from fw_research.experiments.attention_configs import PRESETS, config_flags, model_flags

REPO = Path(__file__).resolve().parents[3]
TEACHER = "softmax"
# a configuration of the comparison (attention_configs.CONFIGS) -> what its distillation trains (--distil-trains),
# None: no distilled row
CONFIGS = {
    "dpfp2-sum-vconv3": None,
    "hedgehog-trainable-sum-vconv3": "maps",
    "t2r32-sum-vconv3": "maps",
    "dpfp2-delta-dec-l2-vconv3": None,
    # hybrids: the teacher's softmax kept where a block's decoding cost does not grow with the output
    # (cross-attention, the encoder), fast weights where it does (the decoder's self-attention)
    "dpfp2-sum-softcross-vconv3": None,
    "hybrid-delta-l2": None,
    # the translation defaults (with their criterion): fast weights in every block, the aligned read of the source
    "dpfp2-delta-dec-align4-ul2-vconv3": "projections",
}
# fine-tuning: the preset's optimiser with a short warm-up to a lower peak (the teacher ends near 6e-4)
FINETUNE = ["--lr", "1e-3", "--warmup-updates", "50"]
DISTIL = ["--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0"]

SPEED = re.compile(r"Translated [\d,]+ sentences \([\d,]+ tokens\) in [\d.]+s \([\d.]+ sentences/s, ([\d.]+) tokens/s\)")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="demo")
    parser.add_argument("--teacher-updates", type=int, default=2000)
    parser.add_argument("--totals", type=int, nargs="+", default=[200, 400], metavar="T")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS), metavar="NAME")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1],
                        help="every step above for each seed, its own teacher included")
    parser.add_argument("--work-dir", type=Path, default=REPO / "compare_work")
    parser.add_argument("--out-dir", type=Path, default=REPO / "results/convert_study")
    args = parser.parse_args(argv)
    if min(args.totals) < 8 or args.teacher_updates < 10:
        parser.error("--totals must be >= 8 (a quarter of it distils) and --teacher-updates >= 10")
    return args


def finish(work, name, record, checkpoint):
    """A trained run's record: BLEU, valid loss and decoding tokens/s of `checkpoint` on the test split."""
    out = work.dir / f"generate.{name}.txt"
    hypotheses = attention_runs.translate(work.data, checkpoint, out)
    record.update(attention_runs.score(hypotheses, work.references))
    speed = SPEED.search(out.read_text())
    record.update(valid_loss=record["curve"][-1][1] if record["curve"] else None,
                  tokens_per_second=float(speed[1]) if speed else None)
    return record


def stored(work, name, make):
    """{name}.json in the study's runs/, made by `make()` when it is not there (a re-run continues)."""
    path = work.dir / "runs" / f"{name}.json"
    if path.is_file():
        return json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    start, record = time.time(), make()
    record["wall_seconds"] = round(time.time() - start, 1)
    path.write_text(json.dumps(record, ensure_ascii=False, indent=1))
    return record


def last_checkpoint(work, name):
    return work.dir / "checkpoints" / name / "checkpoint_last.pt"


def train(work, name, flags, updates):
    record = attention_runs.train(work.data, last_checkpoint(work, name).parent, flags, updates, max(1, updates // 4),
                                  work.dir / f"train.{name}.log", name)
    return record, last_checkpoint(work, name)


def trained(work, name, flags, updates):
    """`name` trained `updates` updates with `flags` and scored, or its stored record."""
    def make():
        record, checkpoint = train(work, name, flags, updates)
        return finish(work, name, record, checkpoint)
    return stored(work, name, make)


def teacher(args, work, seed):
    name = attention_runs.run_name(TEACHER, seed, args.teacher_updates)
    return name, trained(work, name, model_flags(args.preset, TEACHER, seed), args.teacher_updates)


def convert(args, work, config, teacher_name):
    """The teacher converted to `config`'s --fw-* flags: converted/{config}.from-{teacher}.pt in the study's folder
    (one per seed's teacher)."""
    out = work.dir / "converted" / f"{config}.from-{teacher_name}.pt"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        fw = fw_only(config_flags(args.preset, config))
        command = [sys.executable, "-m", "fw_research.convert.convert_softmax",
                   "--from", last_checkpoint(work, teacher_name), "--to", out,
                   "--data", work.data, *fw]
        done = subprocess.run([str(c) for c in command], capture_output=True, text=True)
        if done.returncode:
            sys.exit(f"convert_softmax failed for {config}: {(done.stderr.strip().splitlines() or [''])[-1]}")
    return out


def fw_only(flags):
    """The --fw-* flags of a configuration, with their values: what a conversion and its distillation take (a
    criterion's flags are the fine-tuning's)."""
    kept, keep = [], False
    for text in flags:
        keep = text.startswith("--fw-") if text.startswith("--") else keep
        kept += [text] if keep else []
    return kept


def distil_flags(trains, converted):
    return [*DISTIL, *distil_criterion(trains, converted, DISTIL_LR[trains])]


def converted_run(args, work, config, total, distil, teacher_name, seed):
    """Convert, distil total / 4 updates where `distil`, fine-tune the rest."""
    name = f"{config}.from-{teacher_name}.{'distil.' if distil else ''}t{total}"

    def make():
        start = convert(args, work, config, teacher_name)
        flags = model_flags(args.preset, config, seed)  # [*arch, *training, *fw, --seed]
        arch, fw = PRESETS[args.preset][1], fw_only(config_flags(args.preset, config))
        tune = total
        if distil:
            tune = total - total // 4
            _, start = train(work, name + ".distil", [*arch, *fw, *distil_flags(CONFIGS[config], start),
                                                     "--max-tokens", "2048",
                                                     "--finetune-from-model", start, "--seed", str(seed)],
                             total // 4)
        record, checkpoint = train(work, name, [*flags, *FINETUNE, "--finetune-from-model", start], tune)
        return finish(work, name, record, checkpoint)
    return stored(work, name, make)


def continued_run(args, work, total, teacher_name, seed):
    """The control: the teacher itself trained `total` more updates with the fine-tuning's schedule, so that a
    converted model is also held against softmax given the same extra updates."""
    flags = [*model_flags(args.preset, TEACHER, seed), *FINETUNE,
             "--finetune-from-model", last_checkpoint(work, teacher_name)]
    return trained(work, f"{TEACHER}.from-{teacher_name}.t{total}", flags, total)


def scratch_run(args, work, config, total, seed):
    return trained(work, attention_runs.run_name(config, seed, total), model_flags(args.preset, config, seed), total)


def seed_runs(args, work, seed):
    """The teacher of `seed`, and every run made from it or beside it, each with its seed."""
    teacher_name, teacher_record = teacher(args, work, seed)
    runs = [{"config": TEACHER, "total": total, "start": "continued",
             **continued_run(args, work, total, teacher_name, seed)} for total in args.totals]
    for config in args.configs:
        for total in args.totals:
            runs.append({"config": config, "total": total, "start": "scratch",
                         **scratch_run(args, work, config, total, seed)})
            kinds = (False, True) if CONFIGS[config] is not None else (False,)
            for distil in kinds:
                record = converted_run(args, work, config, total, distil, teacher_name, seed)
                runs.append({"config": config, "total": total, "start": "distilled" if distil else "converted",
                             **record})
    return {"seed": seed, "updates": args.teacher_updates, **teacher_record}, [{"seed": seed, **r} for r in runs]


def main(argv=None):
    args = parse_args(argv)
    corpus = args.work_dir / args.preset  # the comparison's corpus; the study's runs beside it, apart from its runs
    print(catalog_corpus.prepare(corpus, 500, PRESETS[args.preset][0], what="convert_study", long_split=False),
          flush=True)
    work = SimpleNamespace(data=corpus / "data-bin", references=(corpus / "raw/test.de").read_text().splitlines(),
                           dir=args.work_dir / f"{args.preset}-convert")
    teachers, runs = [], []
    for seed in args.seeds:
        seed_teacher, seed_rows = seed_runs(args, work, seed)
        teachers.append(seed_teacher)
        runs += seed_rows
    results = {"benchmark": "convert_study", "preset": args.preset, "seeds": args.seeds, "teachers": teachers,
               "totals": args.totals, "finetune": FINETUNE, "distil": DISTIL, "distil_lr": DISTIL_LR, "machine": platform.machine(),
               "cpu_count": torch.get_num_threads(), "torch": torch.__version__,
               # every stored run's own training and scoring time, the teachers' included (runs made earlier count)
               "wall_minutes": round(sum(r["wall_seconds"] for r in [*teachers, *runs]) / 60, 1), "runs": runs}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stem = args.out_dir / args.preset
    stem.with_suffix(".json").write_text(json.dumps(results, ensure_ascii=False, indent=1))
    print(write(stem, results))


if __name__ == "__main__":
    main()
