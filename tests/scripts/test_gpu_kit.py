"""The GPU path's dry run, so the kit and the check cannot rot between GPU runs (no GPU needed):
the kit's lock resolves for CPython 3.12 manylinux x86_64 with every need met,
research/fw_research/gpu_node/gpu_check.sh parses its options and plans its steps, runs and records them within its
budget, the kit's Triton cache unpacks where it fits the node's Triton, and the summary writer renders a recorded
run."""
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import add_member

from fw_research.benchmarks import bench_fairseq_gpu
from fw_research.gpu_node import gpu_check as check_script
from fw_research.gpu_node import gpu_kit, gpu_prebuilt, gpu_summary

REPO = Path(__file__).resolve().parents[2]
GPU_CHECK = REPO / "research" / "fw_research" / "gpu_node" / "gpu_check.sh"

RECORDED = Path(__file__).parent / "fixtures" / "gpu_run"


def test_the_lock_resolves_for_cp312_and_every_need_is_met():
    assert gpu_kit.check() == []


def test_a_need_the_node_lacks_is_named(tmp_path):
    node = tmp_path / "node.txt"
    node.write_text("".join(line + "\n" for line in gpu_kit.NODE.read_text().splitlines() if "einops" not in line))
    problems = gpu_kit.check(node=node)
    assert problems == ["fla-core needs einops: neither in the kit nor on the node"]


@pytest.mark.parametrize("line, message", [
    ("fla-core 0.6.0 wheel " + "0" * 64 + " why\nfla_core 0.6.0 wheel " + "1" * 64 + " again", "pinned twice"),
    ("fla-core 0.6.0 binary " + "0" * 64 + " why", "kind one of wheel, sdist, wheel-from-sdist"),
    ("fla-core 0.6.0 wheel abc why", "expected 'name version kind sha256 why'"),
])
def test_a_malformed_lock_is_refused_in_one_line(tmp_path, line, message):
    lock = tmp_path / "gpu_kit.lock"
    lock.write_text(line + "\n")
    with pytest.raises(SystemExit, match=message):
        gpu_kit.read_lock(lock)


def gpu_check(*args):
    return subprocess.run(["bash", str(GPU_CHECK), *args], capture_output=True, text=True,
                          env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"})


@pytest.mark.parametrize("part, steps", [
    ("kernels", ["environment", "install_kit", "build_extension", "warm_triton", "pytest_fused", "bench_fused",
                 "pytest_cuda", "memcheck", "racecheck", "build_fast_transformers", "bench_ops"]),
    ("fairseq", ["environment", "install_kit", "build_fairseq", "build_extension", "warm_triton", "cuda_graph",
                 "bench_fairseq", "compare"]),
])
def test_the_dry_run_plans_each_part(part, steps):
    proc = gpu_check("--dry-run", "--part", part)
    assert proc.returncode == 0, proc.stderr
    planned = [line.split()[0] for line in proc.stdout.splitlines() if not line.startswith(" ")]
    assert planned == steps
    assert "compute-sanitizer --tool memcheck" in proc.stdout or part == "fairseq"
    assert "tests/ops/test_fused_read" in proc.stdout or part == "fairseq"


def check_of_an_empty_kit(tmp_path, *args):
    """A Check of a kit whose MANIFEST.json lists nothing, recording under tmp_path/out."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "MANIFEST.json").write_text("{}")
    return check_script.Check(check_script.parse_args(["--kit", str(kit), "--out", str(tmp_path / "out"), *args]))


def recorded_step(check, name):
    """Runs the one step `name` of the check and returns what check.json recorded of it."""
    check.run([step for step in check_script.STEPS if step.name == name])
    return json.loads((check.out / "check.json").read_text())["steps"][0]


def test_a_step_with_nothing_to_run_is_recorded_as_skipped(tmp_path, monkeypatch):
    """pytest_fused in a checkout without tests/ops/test_fused_read*.py: pytest given no file would run them all."""
    check = check_of_an_empty_kit(tmp_path)
    monkeypatch.setattr(check, "commands", lambda: {"pytest_fused": None})
    entry = recorded_step(check, "pytest_fused")
    assert entry["status"] == "skipped" and entry["tail"] == "no tests/ops/test_fused_read*.py here"


def test_only_keeps_the_environment_step_that_the_prebuilt_builds_are_matched_against():
    """Without the node's torch, Python and capability (environment.json) no prebuilt build matches, and
    --only build_fairseq would build fairseq from its sdist (over a minute of device time)."""
    planned = [step.name for step in check_script.plan("fairseq", ["build_fairseq", "bench_fairseq"])]
    assert planned == ["environment", "build_fairseq", "bench_fairseq"]


def test_the_fairseq_benchmark_takes_more_arguments_from_the_check():
    proc = gpu_check("--dry-run", "--part", "fairseq", "--only", "bench_fairseq", "--bench-fairseq-args",
                     "--configs softmax dpfp2_sum_unfused --updates 150")
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.splitlines()[-1]
    assert "-m fw_research.benchmarks.bench_fairseq_gpu" in command
    assert command.endswith("--configs softmax dpfp2_sum_unfused --updates 150")


def test_the_attention_comparison_runs_only_with_its_arguments(tmp_path):
    """The compare step is compare_attention.py with --compare-args and results under --out; without them it is
    skipped, not run with compare_attention.py's defaults (every configuration of the demo preset)."""
    proc = gpu_check("--dry-run", "--part", "fairseq", "--only", "compare", "--out", str(tmp_path), "--compare-args",
                     "--preset base --updates 2000 --configs softmax dpfp2-sum-vconv3")
    assert proc.returncode == 0, proc.stderr
    command = proc.stdout.splitlines()[-1]
    assert "-m fw_research.demo.compare_attention" in command and f"--out-dir {tmp_path / 'compare'}" in command
    assert command.endswith("--preset base --updates 2000 --configs softmax dpfp2-sum-vconv3")
    entry = recorded_step(check_of_an_empty_kit(tmp_path), "compare")
    assert entry["status"] == "skipped" and entry["tail"] == "no --compare-args given"


@pytest.mark.parametrize("args, message", [
    (["--part", "gpu"], "argument --part: invalid choice: 'gpu' (choose from 'all', 'kernels', 'fairseq')"),
    (["--budget-s", "3"], "argument --budget-s: must be more than 15 seconds"),
    (["--kit", "/nonexistent"], "argument --kit: /nonexistent has no MANIFEST.json; run `make gpu-kit`"),
])
def test_bad_options_stop_with_one_line(args, message):
    proc = gpu_check(*args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_run_records_every_step_within_its_budget(tmp_path):
    """On this CPU machine the environment step fails (no CUDA device) and is recorded; the next steps do not
    fit a 25-second budget and are recorded as skipped; check.json and summary.md are written."""
    kit = tmp_path / "kit"
    kit.mkdir()
    (kit / "MANIFEST.json").write_text("{}")
    out = tmp_path / "out"
    proc = gpu_check("--part", "fairseq", "--kit", str(kit), "--out", str(out), "--budget-s", "25")
    assert proc.returncode == 0, proc.stderr
    check = json.loads((out / "check.json").read_text())
    status = {s["name"]: s["status"] for s in check["steps"]}
    assert status == {"environment": "failed", "install_kit": "skipped", "build_fairseq": "skipped",
                      "build_extension": "skipped", "warm_triton": "skipped", "cuda_graph": "skipped",
                      "bench_fairseq": "skipped", "compare": "skipped"}
    assert "torch sees no CUDA device" in check["steps"][0]["tail"]
    assert "out of budget" in check["steps"][1]["tail"]
    assert (out / "logs.txt").exists() and "| environment | failed |" in (out / "summary.md").read_text()
    assert len(list(out.iterdir())) <= 8  # all of it fits what a remote run returns


def test_the_summary_renders_a_recorded_run(tmp_path):
    out = tmp_path / "run"
    shutil.copytree(RECORDED, out)
    text = gpu_summary.render(out)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    assert "| met |" in rows["compute-sanitizer --tool memcheck: no error"]
    assert "| missed |" in rows["compute-sanitizer --tool racecheck: no error"]
    assert "| 1 failed, 40 passed | missed |" in rows["pytest tests/ops/test_fused_read*.py: every case passes"]
    assert "| 2.00x, 1.50x | met |" in rows["delta, bf16, E = d = 64, T <= 256: fla's best delta kernel / ours >= 1.5"]
    assert "ours only (fla cannot run it) | no data |" in rows[
        "delta, fp32, E = d = 64, T <= 256: fla's best delta kernel / ours >= 1.5"]
    assert "| 1.20x | missed |" in rows["sum, fp32, E = d = 64, T <= 256: fast-transformers / ours >= 2"]
    assert "| 1 of 2 shapes | missed |" in rows["delta: E = 512 runs on the kernel"]
    assert "worst 1.25x the floor over 1 shapes | met |" in text
    # the fused read's targets (bench_fused_read.json, by hand): 3x fla at MT shapes, 1.5x at T = 256
    assert "| 3.20x | met |" in rows["delta, bf16, MT shapes (T <= 64): fla's best delta kernel / fused read >= 3.0"]
    assert "| 1.20x | missed |" in rows["delta, bf16, T = 256: fla's best delta kernel / fused read >= 1.5"]
    assert "| 3 of 3 reads (fla's chunked kernel: refused) | met |" in rows[
        "fused read runs fp32, every rule, within tolerance"]
    assert "| 2 of 3 reads (fla's chunked kernel: refused) | missed |" in rows[
        "fused read runs E = 512, every rule, within tolerance"]
    assert "| mt | bf16 | 32 | 256 | delta | True | 0.300 |" in text
    # the fairseq targets (bench_fairseq.json, a CPU smoke run): steady-state words/s and peak memory
    for name, floor in gpu_summary.FAIRSEQ_FLOORS:
        assert f"transformer_fw_small {name} --fp16: steady-state train words/s >= {floor:.2f}x softmax" in rows
    assert "no runs | no data |" in rows["transformer_fw_small --fp16: train peak memory <= softmax's "
                                         "(dpfp2_delta_dec_align4_ul2, table1_dpfp_nu2, dpfp2_sum, dpfp2_delta_dec)"]
    assert "| softmax | " in text and "generate N=4" in text and "| table1_dpfp_nu2 | " in text
    assert "top 5 operators by self CPU time" in text


def test_the_summary_renders_the_first_h100_run():
    """The committed run (benchmarks/results/gpu_h100_2026-11-25): both sanitizers' real last lines read as
    clean, and the committed summary.md is what the script renders from the committed files."""
    run = REPO / "benchmarks" / "results" / "gpu_h100_2026-11-25"
    text = gpu_summary.render(run)
    assert "| compute-sanitizer --tool memcheck: no error | 0 errors | met |" in text
    assert "| compute-sanitizer --tool racecheck: no error | 0 errors | met |" in text
    assert text == (run / "summary.md").read_text()


def test_the_fairseq_benchmark_runs_end_to_end_on_a_cpu(tmp_path):
    """fw_research.benchmarks.bench_fairseq_gpu through the real fairseq CLIs on tiny settings: the same code the GPU
    check runs, so a fairseq or plugin change that breaks it fails here first. Six updates in epochs of three (the
    training set sized for it), the first update profiled and two of each epoch in windows; one round (each fairseq
    process costs seconds to start: the rounds' order is test_bench_fused_read.py's)."""
    out = tmp_path / "bench_fairseq.json"
    proc = subprocess.run([sys.executable, "-m", "fw_research.benchmarks.bench_fairseq_gpu", "--out", str(out),
                           "--work", str(tmp_path / "work"), "--arch", "transformer_fw_small", "--configs", "softmax",
                           "dpfp2_delta_dec_align4_ul2", "--updates", "6", "--log-interval", "1",
                           "--lengths", "4", "--sentences", "2", "--max-tokens", "512", "--profile-update", "1", "--rounds", "1",
                           "--profile-window", "2"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["not_run"] == [] and "epochs >= 2" in result["steady_state_rule"]
    # the translation defaults trained with their own criterion: --unlikelihood-alpha parses only with it
    fw = result["configs"]["dpfp2_delta_dec_align4_ul2"]
    assert fw["flags"] == " ".join(bench_fairseq_gpu.SHIPPED["dpfp2_delta_dec_align4_ul2"])
    assert fw["flags"].endswith("--criterion fw_unlikelihood --unlikelihood-alpha 2")
    (run,) = fw["runs"]
    assert run["round"] == 0 and run["epochs"] == 2 and run["first_epoch_updates"] == 3 and run["intervals_used"] == 2
    assert fw["train"]["updates"] == 6 and fw["train"]["wps_median"] == run["wps_steady"] > 0
    assert fw["profile"]["update"] == 1 and 0 < len(fw["profile"]["ops"]) <= 15
    # updates 2-3 of epoch 1 and 5-6 of epoch 2; a CPU has no kernels, launches or synchronisations to count
    assert [(w["epoch"], w["updates"]) for w in fw["windows"]] == [(1, 2), (2, 2)]
    assert all(w["wall_ms"] > 0 and w["kernels"] is None and 0 < len(w["top"]) <= 15 for w in fw["windows"])
    assert [g["length"] for g in fw["generate"]] == [4] and fw["generate"][0]["tokens"] == 2 * 5  # N + eos each
    assert fw["vs_softmax"]["train_wps"] > 0 and fw["vs_softmax"]["generate_tokens_per_s"]["4"] > 0


def kit_with_cache(tmp_path, triton="3.6.0"):
    """A kit holding a Triton cache of one kernel, recorded as made elsewhere (its group names old paths)."""
    kit, made = tmp_path / "kit", tmp_path / "made_elsewhere" / "KEY"
    kit.mkdir(parents=True)
    archive = kit / "prebuilt-warm_triton.tar.gz"
    group = json.dumps({"child_paths": {f"k.{ext}": str(made / f"k.{ext}") for ext in ("json", "cubin", "ptx")}})
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in {"KEY/__grp__k.json": group, "KEY/k.json": "{}", "KEY/k.cubin": "binary"}.items():
            add_member(tar, name, text.encode())
    row = {"kind": "prebuilt", "step": "warm_triton", "file": archive.name, "sha256": gpu_prebuilt.file_sha256(archive),
           "from": gpu_prebuilt.digest(*gpu_prebuilt.sources("warm_triton", REPO, kit)), "torch": "2.11.0+cu130",
           "python": ".".join(map(str, sys.version_info[:2])), "arch": "9.0a", "triton": triton}
    (kit / "MANIFEST.json").write_text(json.dumps({"files": [row]}))
    return kit


def test_the_kits_triton_cache_is_unpacked_where_it_is_and_fits_the_nodes_triton(tmp_path):
    site, env = tmp_path / "site", {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    node = {"torch": "2.11.0+cu130", "capability": "9.0", "triton": "3.6.0"}
    used, why = gpu_prebuilt.unpack("warm_triton", kit_with_cache(tmp_path), REPO, site, node, env)
    assert used, why
    group = json.loads((site / "triton_cache" / "KEY" / "__grp__k.json").read_text())["child_paths"]
    assert group == {name: str(site / "triton_cache" / "KEY" / name) for name in ("k.json", "k.cubin")}
    used, why = gpu_prebuilt.unpack("warm_triton", kit_with_cache(tmp_path / "other"), REPO, site,
                                    dict(node, triton="3.7.1"), env)
    assert not used and why == "built for Triton 3.6.0, this node has 3.7.1"


def test_the_cuda_graph_check_stops_in_one_line_without_cuda(monkeypatch):
    from fw_research.benchmarks import gpu_cuda_graph

    monkeypatch.setattr(gpu_cuda_graph.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="gpu_cuda_graph: torch sees no CUDA device on this machine"):
        gpu_cuda_graph.main([])


@pytest.mark.parametrize("case", [("causal", "delta", "dpfp", 3), ("cross", "sum", "elu", 2)], ids=str)
def test_the_cuda_graph_cases_run_on_a_cpu(case):
    """The GPU step's cases, with the step re-run where the graph would replay: the layer, its decoding
    state and the copies the replays are compared against work on this machine."""
    from fw_research.benchmarks import gpu_cuda_graph

    gpu_cuda_graph.check(*case, "cpu", gpu_cuda_graph.rerun)


def test_the_cuda_graph_steps_compile_check_runs_on_a_cpu():
    from fw_research.benchmarks import gpu_cuda_graph

    gpu_cuda_graph.compiled_training("gated_delta", "cpu")
