"""fw_research.synthetic.synthetic_retrieval end to end on a tiny grid: results files, figures, resume."""
import json

import pytest
import torch

from fw_research.synthetic import synthetic_retrieval


@pytest.fixture(scope="module")
def script():
    return synthetic_retrieval


def test_tiny_run_writes_results_and_figures_and_resumes(script, tmp_path):
    threads = torch.get_num_threads()
    out, figures = tmp_path / "results", tmp_path / "figures"
    argv = ["--quick", "--out", str(out), "--figures", str(figures), "--sizes", "4", "6", "--max-steps", "20",
            "--threads", "1"]
    try:
        script.main(["--setting", "1", "--models", "linear", "dpfp-1"] + argv)
        script.main(["--setting", "2", "--models", "sum", "ours (delta)"] + argv)
        first = json.loads((out / "setting1_quick.json").read_text())["cells"]
        assert {(c["model"], c["S"]) for c in first} == {(m, s) for m in ("linear", "dpfp-1") for s in (4, 6)}
        assert all(c["curve"] and c["steps"] <= 20 for c in first)
        assert (out / "setting1_quick.csv").read_text().count("\n") == 5  # header + 4 cells
        assert (figures / "synthetic_capacity_quick.png").stat().st_size > 0
        assert (figures / "synthetic_update_rules_quick.png").stat().st_size > 0
        # a second run finds every cell done and trains nothing: the file is unchanged
        script.main(["--setting", "1", "--models", "linear", "dpfp-1"] + argv)
        assert json.loads((out / "setting1_quick.json").read_text())["cells"] == first
    finally:
        torch.set_num_threads(threads)


def test_unknown_model_is_refused(script, tmp_path):
    with pytest.raises(SystemExit):
        script.main(["--setting", "1", "--quick", "--models", "ours (delta)", "--out", str(tmp_path)])
