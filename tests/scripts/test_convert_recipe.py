"""fw_research.convert.convert_recipe: one command converts a fairseq-trained softmax checkpoint, distils its attention
into trainable Hedgehog maps under the delta rule, fine-tunes, and scores teacher and student with sacreBLEU; run again,
it skips every finished step."""
import json
import subprocess
import sys

import pytest

from conftest import REPO
from factories import parse_model_args
from fw_research.convert import convert_recipe

RECIPE = [sys.executable, "-m", "fw_research.convert.convert_recipe"]


def test_the_recipe_runs_once_and_skips_what_is_done(teacher):
    work, data, source = teacher
    out = work / "recipe"
    cmd = [*RECIPE, "--teacher", str(source), "--data", str(data), "--work-dir", str(out), "--distil-updates", "2",
           "--finetune-updates", "2", "--beam", "2", "--post-process", "none",
           "--train-args", "--cpu --max-tokens 400 --seed 1 --num-workers 0",
           "--fw-feature-map", "hedgehog", "--fw-hedgehog-trainable", "--fw-update-rule", "delta"]
    first = subprocess.run(cmd, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "--criterion" in (out / "distil.log").read_text() or "fw_attention_distillation" in (
        out / "distil.log").read_text()
    scores = {name: json.loads((out / f"{name}.score").read_text()) for name in ("teacher", "student")}
    assert all(score["sentences"] == 8 and score["bleu"] >= 0 for score in scores.values())
    stamps = {path: path.stat().st_mtime_ns for path in out.rglob("*") if path.is_file()}
    again = subprocess.run(cmd, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout == first.stdout and "student: BLEU" in again.stdout
    assert stamps == {path: path.stat().st_mtime_ns for path in out.rglob("*") if path.is_file()}  # nothing redone


def test_a_failed_step_stops_in_one_line(teacher, tmp_path):
    _, data, source = teacher
    done = subprocess.run([*RECIPE, "--teacher", str(source), "--data", str(data), "--work-dir", str(tmp_path),
                           "--fw-feature-map", "dpfp"], capture_output=True, text=True)
    message = [line for line in done.stderr.splitlines() if "tensorboardX" not in line]
    assert done.returncode != 0 and len(message) == 1 and "fairseq-train failed" in message[0], done.stderr


@pytest.mark.parametrize("flags,criterion", [([], "fw_unlikelihood"), (["--fw-cross-align", "0"],
                                                                      "label_smoothed_cross_entropy")])
def test_the_aligned_read_fine_tunes_with_the_criterion_it_was_measured_with(flags, criterion):
    model_args = parse_model_args(flags)  # no --fw-* flag: the translation defaults, the aligned read on
    assert convert_recipe.finetune_criterion(model_args)[:2] == ["--criterion", criterion]


def test_projections_distil_against_the_converted_checkpoint(tmp_path):
    args = convert_recipe.parse(["--teacher", "t.pt", "--data", "d", "--work-dir", str(tmp_path),
                                 "--distil-trains", "projections"])
    flags = [str(x) for x in convert_recipe.criterion_flags(args, parse_model_args([]), "distil")]
    assert flags[flags.index("--distil-teacher") + 1] == str(tmp_path / "converted.pt")
    assert flags[flags.index("--lr") + 1] == "0.001"  # the projections' rate, unless --distil-lr is given
