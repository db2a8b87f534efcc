"""The GPU benchmarks' machinery on a CPU, where CI runs: bench_fused_read_gpu.py end to end on a tiny case under
Triton's interpreter, the fused read's kernels compiled for the GPU's architecture without one
(fw_research.gpu_node.gpu_triton_cache), and bench_fairseq_gpu.py's steady state, run order, configurations and
profile."""
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO

from fw_research.benchmarks import bench_fairseq_gpu, bench_fused_read_gpu, fairseq_run
from fw_research.experiments.attention_configs import config_flags

ENV = dict(os.environ, PYTHONPATH=str(REPO), TRITON_INTERPRET="1")


def test_the_op_benchmark_runs_a_tiny_case_on_a_cpu(tmp_path):
    """Every method on the tiny case: the old path is the float64 reference itself; the fused read (under the
    interpreter) matches it to float64 rounding; fla is absent here or has no such read, recorded, not raised."""
    out = tmp_path / "bench_fused_read.json"
    proc = subprocess.run([sys.executable, "-m", "fw_research.benchmarks.bench_fused_read_gpu", "--device", "cpu",
                           "--cases", "tiny", "--reps", "1", "--out", str(out)], env=ENV, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = json.loads(out.read_text())["records"]
    assert [(r["rule"], r["causal"]) for r in records] == bench_fused_read_gpu.RULE_CASES
    for r in records:
        old, ours = r["methods"]["old"], r["methods"]["ours"]
        assert old["error"] == {"out": 0.0, "grads": 0.0} and old["fwd_bwd_ms"] > 0
        assert ours["correct"] and max(ours["error"].values()) < 1e-12, ours
        assert r["old_over_ours"] > 0
        for fla in ("fla_chunk", "fla_recurrent"):
            reason = r["methods"][fla].get("skipped", "")
            assert reason.startswith(("not available", "fla has no such read", "refused")) or "fwd_bwd_ms" in r[
                "methods"][fla]


def test_the_ratios_and_layouts():
    x = torch.arange(24.0).view(1, 2, 3, 4)
    assert torch.equal(bench_fused_read_gpu.head_first(bench_fused_read_gpu.in_layout(x, "seq"), "seq"), x)
    methods = {"ours": {"fwd_bwd_ms": 2.0}, "old": {"fwd_bwd_ms": 5.0}, "fla_chunk": {"skipped": "refused: E"},
               "fla_recurrent": {"fwd_bwd_ms": 8.0}}
    assert bench_fused_read_gpu.ratios(methods) == {"old_over_ours": 2.5, "fla_over_ours": 4.0}
    assert bench_fused_read_gpu.ratios({"ours": {"skipped": "not available"}, "old": {"fwd_bwd_ms": 1.0}}) == {
        "old_over_ours": None, "fla_over_ours": None}


def test_the_fused_kernels_compile_for_the_gpu_without_one(tmp_path):
    """fw_research.gpu_node.gpu_triton_cache here: the kernels of the tiny case's delta read (forward and backward)
    compiled for capability 9.0 through Triton's JIT with the offline driver; run again on the cache moved elsewhere,
    every kernel is a cache hit. (The delta read alone: each kernel takes seconds to compile on two cores.)"""
    first, moved = tmp_path / "cache", tmp_path / "moved"
    script = [sys.executable, "-m", "fw_research.gpu_node.gpu_triton_cache", "--cases", "tiny", "--rules",
              "delta", "--no-training", "--cache"]
    env = {k: v for k, v in ENV.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([*script, str(first)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((first / "fused_read_cache.json").read_text())
    assert record["launches"] == ["tiny delta causal"] and record["kernels"] >= 2
    assert all(p.suffix in (".json", ".cubin") for p in first.glob("*/*"))
    first.rename(moved)
    proc = subprocess.run([*script, str(moved)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((moved / "fused_read_cache.json").read_text())["kernels"] == record["kernels"]  # no new entry


def test_steady_state_reads_the_epochs_after_the_first_less_their_first_interval():
    logs = [{"epoch": 1, "wps": 10.0}, {"epoch": 1, "wps": 50.0}, {"epoch": 1, "train_wps": 40.0},
            {"epoch": 2, "wps": 70.0}, {"epoch": 2, "wps": 100.0}, {"epoch": 2, "wps": 102.0},
            {"epoch": 3, "wps": 60.0}, {"epoch": 3, "wps": 98.0}]
    assert bench_fairseq_gpu.steady_state(logs) == (100.0, [100.0, 102.0, 98.0])
    assert bench_fairseq_gpu.steady_state(logs[:3]) == (None, [])


def test_the_rounds_interleave_every_configuration():
    order = bench_fairseq_gpu.run_order(["softmax", "a", "b"], 3)
    assert order == [(0, "softmax"), (0, "a"), (0, "b"), (1, "b"), (1, "a"), (1, "softmax"),
                     (2, "softmax"), (2, "a"), (2, "b")]


def test_the_configurations_are_the_shipped_ones_and_table_1s():
    assert bench_fairseq_gpu.SHIPPED["dpfp2_sum"] == config_flags("demo", "dpfp2-sum-vconv3")
    assert bench_fairseq_gpu.SHIPPED["dpfp2_delta_dec"] == config_flags("demo", "dpfp2-delta-dec-vconv3")
    aligned = config_flags("demo", "dpfp2-delta-dec-align4-ul2-vconv3")  # with its criterion
    assert bench_fairseq_gpu.configs()["dpfp2_delta_dec_align4_ul2"] == aligned
    configs = bench_fairseq_gpu.configs()
    assert configs["table1_dpfp_nu2"] == ["--fw-preset", "paper", "--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2"]
    # a row's criterion comes with it, and every row's config file is a configuration (Standard is softmax)
    assert configs["table1_dpfp_nu2_delta_align4"][-4:] == ["--criterion", "fw_unlikelihood", "--unlikelihood-alpha",
                                                            "2"]
    rows = {p.stem for p in (REPO / "configs/wmt14_en_de").glob("*.sh")} - {"common", "standard"}
    assert {name for name in configs if name.startswith("table1_") and not name.endswith("_unfused")} == {
        f"table1_{row}" for row in rows}


def test_an_unfused_configuration_is_its_twin_with_the_fused_read_switched_off_in_the_runner():
    configs = bench_fairseq_gpu.configs()
    unfused = [name for name in configs if name.endswith(bench_fairseq_gpu.UNFUSED)]
    assert sorted(unfused) == ["dpfp2_delta_dec_align4_ul2_unfused", "dpfp2_delta_dec_unfused", "dpfp2_sum_unfused",
                              "table1_dpfp_nu2_unfused"]
    for name in unfused:
        assert configs[name] == configs[name.removesuffix(bench_fairseq_gpu.UNFUSED)]
        assert bench_fairseq_gpu.runner_env(name)["FW_NO_FUSED_READ"] == "1"
    assert bench_fairseq_gpu.runner_env("dpfp2_sum") is None
    assert "FW_NO_FUSED_READ" not in bench_fairseq_gpu.runner_env("dpfp2_sum", FW_PROFILE_UPDATE="3")
    assert bench_fairseq_gpu.parse_args(["--out", "x"]).configs == bench_fairseq_gpu.DEFAULT_NAMES


def test_the_runner_without_the_fused_read_sends_every_block_to_the_other_path(monkeypatch):
    pytest.importorskip("triton")
    from factories import build_model, random_tokens
    from fw_fairseq.ops.fused_read import dispatch

    # the plain read of the source: the aligned one has a fused form of its own (fused_aligned_read_for)
    model, d = build_model(["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-cross-align", "0",
                            "--encoder-layers", "1", "--decoder-layers", "1"])
    model.double().eval()
    g = torch.Generator().manual_seed(0)
    src, prev = random_tokens(d, 2, 5, g), random_tokens(d, 2, 4, g)
    calls = []
    original = dispatch.read
    monkeypatch.setattr(dispatch, "read", lambda *args: calls.append(args[1].name) or original(*args))
    monkeypatch.setattr(dispatch, "DEVICES", ("cuda", "cpu"))  # the CPU under Triton's interpreter (conftest.py)
    monkeypatch.setattr(dispatch, "CROSSOVER", dispatch.CROSSOVER)  # restored after the runner's change
    with torch.no_grad():
        fused, _ = model(src, torch.tensor([5, 5]), prev)
        assert len(calls) == 3  # encoder self-, decoder self- and cross-attention
        fairseq_run.no_fused_read()
        other, _ = model(src, torch.tensor([5, 5]), prev)
    assert len(calls) == 3
    torch.testing.assert_close(other, fused, rtol=1e-9, atol=1e-9)


def test_the_ratios_take_medians_spreads_and_peaks_over_runs():
    def runs(*wps, peak):
        return {"runs": [{"wps_steady": w, "peak_MiB": peak} for w in wps]}

    results = {"updates": 6, "configs": {"softmax": runs(100.0, 110.0, peak=1000.0),
                                         "dpfp2_sum": runs(120.0, 99.0, 105.0, peak=900.0)}}
    bench_fairseq_gpu.ratios(results)
    fw = results["configs"]["dpfp2_sum"]
    assert fw["train"]["wps_median"] == 105.0 and abs(fw["train"]["spread"] - 21 / 105) < 1e-12
    assert fw["vs_softmax"]["train_wps"] == 105.0 / 105.0 and fw["vs_softmax"]["peak_memory"] == 0.9


def test_the_profile_table_lists_the_top_operators():
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        a = torch.randn(64, 64)
        for _ in range(3):
            a = torch.relu(a @ a)
    table = fairseq_run.top_ops(prof, 2, on_gpu=False)
    assert table["clock"] == "self CPU time" and len(table["ops"]) == 2
    assert table["ops"][0]["self_ms"] >= table["ops"][1]["self_ms"] and 0 < table["ops"][0]["percent"] <= 100
