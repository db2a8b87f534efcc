"""fw_research.convert.convert_study end to end on a small corpus, through the real fairseq CLIs: the teacher, a
configuration trained from scratch, converted and fine-tuned, and converted, distilled and fine-tuned, each for the
same total of updates, and the teacher trained that total more (the control); scored, tabled, plotted, and nothing
trained again on a re-run."""
import json
import shutil

from fw_research.convert import convert_study


def _corpus(data_bin, work_dir):
    corpus = work_dir / "demo"  # where convert_study finds a prepared corpus of the demo preset
    (corpus / "raw").mkdir(parents=True)
    (corpus / "data-bin").symlink_to(data_bin / "bin")
    shutil.copy(data_bin / "test.de", corpus / "raw/test.de")


def test_teacher_scratch_converted_and_distilled_at_equal_updates(data_bin, tmp_path, capsys):
    _corpus(data_bin, tmp_path / "work")
    argv = ["--work-dir", str(tmp_path / "work"), "--out-dir", str(tmp_path / "out"), "--teacher-updates", "12",
            "--totals", "8", "--configs", "t2r32-sum-vconv3"]
    convert_study.main(argv)
    results = json.loads((tmp_path / "out/demo.json").read_text())
    [teacher] = results["teachers"]
    assert teacher["updates"] == 12 and teacher["seed"] == 1 and teacher["bleu"] >= 0
    runs = {run["start"]: run for run in results["runs"]}
    assert set(runs) == {"scratch", "continued", "converted", "distilled"}
    assert runs["continued"]["config"] == "softmax"  # the control: the teacher trained the same total more
    study = tmp_path / "work/demo-convert"
    for start, run in runs.items():
        assert run["total"] == 8 and run["seed"] == 1 and run["tokens_per_second"] > 0 and run["valid_loss"] > 0
        assert run["curve"][-1][0] == (6 if start == "distilled" else 8)  # the distillation's 2 count
    distil_log = next(study.glob("train.*.distil.t8.distil.log")).read_text()
    assert "fw_attention_distillation" in distil_log and '"num_updates": "2"' in distil_log
    assert (study / "converted/t2r32-sum-vconv3.from-softmax.s1.u12.pt").is_file()  # one per seed's teacher
    table = (tmp_path / "out/demo.md").read_text()
    assert table in capsys.readouterr().out and (tmp_path / "out/demo.png").stat().st_size > 0
    for start, run in runs.items():
        assert f"| {run['config']} | {start} | 8 | 1 |" in table
    logs = {path: path.stat().st_mtime for path in study.glob("*.log")}
    convert_study.main(argv)  # every run stored: nothing trains or translates again
    assert {path: path.stat().st_mtime for path in study.glob("*.log")} == logs
    assert json.loads((tmp_path / "out/demo.json").read_text())["runs"] == results["runs"]


def test_a_conversion_takes_the_fw_flags_and_the_defaults_distil_their_projections_from_the_converted_file():
    flags = ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-cross-align", "4", "--criterion",
             "fw_unlikelihood", "--unlikelihood-alpha", "2", "--fw-encoder-conv", "3"]
    assert convert_study.fw_only(flags) == ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-cross-align", "4",
                                            "--fw-encoder-conv", "3"]
    trains = convert_study.CONFIGS["dpfp2-delta-dec-align4-ul2-vconv3"]
    distil = convert_study.distil_flags(trains, "converted.pt")
    assert distil[distil.index("--distil-trains") + 1] == "projections"
    assert distil[distil.index("--distil-teacher") + 1] == "converted.pt"
    assert "--distil-teacher" not in convert_study.distil_flags("maps", "converted.pt")
