"""The kernel reads' benchmark runs end to end on tiny shapes (a smoke test: no timing is asserted)."""
import json
import subprocess
import sys

import pytest
import torch

from conftest import REPO
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS, cpu_kernel


@pytest.mark.skipif(cpu_kernel(torch.zeros(1)) is None, reason="fw_fairseq._cpu is not built")
def test_bench_reads_cpu_times_every_map_forward_and_backward(tmp_path):
    cmd = [sys.executable, "-m", "fw_research.benchmarks.bench_reads_cpu", "--batch", "2", "--tokens", "3",
           "--rounds", "1", "--favor-features", "5", "--causal", "--out", str(tmp_path / "reads")]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    result = json.loads((tmp_path / "reads.json").read_text())
    assert set(result["ms"]) == set(KERNEL_MAPS) and all(t > 0 for ms in result["ms"].values() for t in ms)
    assert result["machine"]["shape_BHTd"] == [2, 2, 3, 64] and result["machine"]["causal"]
    assert "| favor |" in out and (tmp_path / "reads.md").read_text().strip() == out.strip()
