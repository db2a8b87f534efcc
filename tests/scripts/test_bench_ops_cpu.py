"""The CPU ops benchmark runs end to end on tiny shapes (a smoke test: no timing is asserted)."""
import json
import subprocess
import sys

from conftest import REPO


def test_bench_ops_cpu_writes_rows_for_each_thread_count_and_target_verdicts(tmp_path):
    cmd = [sys.executable, "-m", "fw_research.benchmarks.bench_ops_cpu", "--lengths", "8", "512", "--naive-max-t", "8",
           "--repeats", "1", "--threads", "1", "2", "--heads", "1", "--batch", "1", "--out-dir", str(tmp_path)]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    result = json.loads((tmp_path / "ops_cpu.json").read_text())
    rows = {(r["threads"], r["rule"], r["T"]): r for r in result["rows"]}
    assert set(rows) == {(t, rule, T) for t in (1, 2) for rule in ("sum", "delta") for T in (8, 512)}
    assert rows[1, "delta", 8]["fwd_bwd_speedup"] > 0 and rows[1, "delta", 8]["chunked_peak_mib"] is not None
    assert rows[2, "sum", 512]["naive_fwd_ms"] is None  # above --naive-max-t: chunked only
    assert "target >= 10x" in out and "delta fwd+bwd" in (tmp_path / "ops_cpu.md").read_text()
