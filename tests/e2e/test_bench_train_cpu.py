"""fw_research.benchmarks.bench_train_cpu on a small corpus: real updates of every row on the same batches, the
table and JSON with softmax as the reference, and a row list without softmax refused in one line."""
import json
import shutil

import pytest

from fw_research.benchmarks import bench_train_cpu


def _work(data_bin, tmp_path):
    work = tmp_path / "work"
    (work / "raw").mkdir(parents=True)
    (work / "data-bin").symlink_to(data_bin / "bin")
    shutil.copy(data_bin / "test.de", work / "raw/test.de")
    return work


def test_rows_are_timed_side_by_side(data_bin, tmp_path, capsys):
    out = tmp_path / "train_cpu"
    bench_train_cpu.main(["--rows", "softmax", "dpfp2-delta-dec-l2", "--batches", "2", "--rounds", "2",
                          "--work-dir", str(_work(data_bin, tmp_path)), "--out", str(out)])
    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["seconds_per_update"]) == {"softmax", "dpfp2-delta-dec-l2"}
    assert all(s > 0 for s in result["seconds_per_update"].values())
    assert result["ratio_to_softmax"]["softmax"] == 1.0 and result["batches"] == 2
    table = out.with_suffix(".md").read_text()
    assert "| softmax | " in table and "| dpfp2-delta-dec-l2 | " in table and table in capsys.readouterr().out


def test_rows_without_softmax_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench_train_cpu.main(["--rows", "elu-sum"])
    assert "include softmax" in capsys.readouterr().err
