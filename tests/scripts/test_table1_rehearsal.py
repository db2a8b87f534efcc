"""scripts/wmt14/table1.sh, rehearsed on the CPU: softmax and the fast-weight row furthest from it (DPFP with the delta
rule, the aligned cross-attention and unlikelihood), each with its own command line (the shared recipe and the
config's flags) and tiny dims appended, on the fixture corpus prepared by prepare_wmt14_en_de, for
one epoch each;
then each row's best checkpoint scored on valid and test and the table rendered, through the real fairseq-train,
fairseq-generate and sacrebleu. Re-running the same command trains and scores nothing again. The other rows differ
from these only in their flags: the dry run below prints every row's commands, test_configs.py builds every row's
model from its flags, and test_train_eval.py trains a FAVOR+ row through train.sh."""
import json
import shlex
import subprocess

from conftest import REPO, WMT14, run
from test_configs import CONFIGS
from test_train_eval import SHORT, TINY

REHEARSED = ("standard", "dpfp_nu2_delta_align4")


def table1(work, *extra):
    return run([WMT14 / "table1.sh", "--gpus", "0", "--data", work / "data-bin" / "bpe300",
                "--save-root", work / "rehearsal" / "ckpt", "--results", work / "rehearsal" / "results",
                "--train-args", shlex.join([*TINY, "--max-epoch", "1"]), "--generate-args", shlex.join(SHORT),
                "--rows", ",".join(REHEARSED), *extra])


def test_every_row_trains_scores_and_tables(prepared):
    work, _ = prepared
    first = table1(work)
    table = (work / "rehearsal" / "results" / "table1.md").read_text()
    assert table in first.stdout
    lines = table.splitlines()
    for row in ("Standard", "DPFP + delta, aligned cross-attention, unlikelihood (beyond the paper)"):
        cells = next(line for line in lines if line.startswith(f"| {row} |")).split("|")[2:-1]
        # a row trained by a config of ours has its score beside the paper's; each metric is labelled
        assert any(not cell.strip().startswith("–") and cell.strip() for cell in cells), row
    assert "sacreBLEU (detokenised" in table and "tokenised BLEU (compound-split" in table
    assert "nrefs:1|case:mixed|eff:no|tok:13a" in table  # the signature
    for name in REHEARSED:
        assert f"| {name} | 0 |" in table  # its training time, on the CPU
    again = table1(work)
    assert "train.sh:" not in again.stderr and "sacreBLEU" not in again.stdout.replace(table, "")


def test_dry_run_prints_every_command_and_the_cost():
    out = run([WMT14 / "table1.sh", "--dry-run", "--data", REPO / "no-data-here"]).stdout
    for name in CONFIGS:
        assert f"train.sh {name}" in out and f"| {name} |" in out
        assert out.count(f"--name {name} ") == 2  # valid and test
    assert "-m fw_research.wmt14.prepare_wmt14_en_de --dest-dir" in out
    assert "GPU-hours" in out and "assumed: 4.5 M pairs" in out and "NVIDIA H200" in out


def test_a_gpu_count_that_cannot_keep_the_batch_is_refused():
    proc = subprocess.run([WMT14 / "table1.sh", "--dry-run", "--gpus", "5", "--gpus-per-row", "5"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.splitlines()[-1].endswith(
        "--gpus-per-row 5 cannot keep the paper's 48 batches per update; allowed: 1, 2, 3, 4, 6, 8, 12, 16, 24, 48")


def test_the_dry_run_prices_a_row_from_the_newest_measurement_of_its_own_flags(tmp_path):
    from fw_research.benchmarks.bench_fairseq_gpu import TABLE1, config_flags
    from fw_research.wmt14 import table1_cost

    def bench(folder, configs):
        path = tmp_path / folder / "run" / "bench_fairseq.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"device": folder.split("_")[1], "configs": {
            name: {"flags": flags, "train": {"wps_median": rate}} for name, (flags, rate) in configs.items()}}))

    own = " ".join(config_flags(TABLE1["table1_dpfp_nu2"]))
    bench("gpu_h100_2026-12-01", {"dpfp2_sum": ("older flags", 40000.0), "table1_dpfp_nu2": (own, 30000.0)})
    bench("gpu_h200_2026-12-03", {"dpfp2_sum": ("older flags", 50000.0), "softmax": ("--fw-attention none", 60000.0)})
    found = table1_cost.measurements(tmp_path)
    assert [m[0] for m in found] == ["gpu_h200_2026-12-03"] * 2 + ["gpu_h100_2026-12-01"] * 2
    # its own flags, though older than its stand-in's newest run; a row never measured takes its stand-in's newest
    assert table1_cost.row_rate("dpfp_nu2", found) == (30000.0, "table1_dpfp_nu2", "", "gpu_h100_2026-12-01", "h100")
    assert table1_cost.row_rate("linear", found)[:2] == (50000.0, "dpfp2_sum")
    assert "stand-in" in table1_cost.row_rate("linear", found)[2]
    assert table1_cost.row_rate("standard", found) == (60000.0, "softmax", "", "gpu_h200_2026-12-03", "h200")
    assert table1_cost.row_rate("dpfp_nu2_delta", found) is None  # neither its flags nor its stand-in measured
