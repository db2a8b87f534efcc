"""The GPU kit's Triton cache leaves a training run nothing to compile: every fused-read kernel launch of a
transformer_fw training step, in the GPU benchmark's configurations (fw_research.benchmarks.bench_fairseq_gpu, 16 heads
of 64, fp16), at batch lengths of every block length and with padding on either side, is one of the launches that
fw_research.gpu_node.gpu_triton_cache compiles (training_launches), as Triton's JIT specialises them. No kernel compiles
here: fixtures/triton_launch_keys.py records each launch's key."""
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from fw_research.benchmarks import bench_fairseq_gpu

pytest.importorskip("triton")

KEYS = REPO / "tests" / "scripts" / "fixtures" / "triton_launch_keys.py"
# the benchmark's fast-weight configurations, one of each set of blocks: the sum rule throughout (the encoder's, the
# decoder's causal and the cross-attention's reads), the delta rule in the decoder with the aligned cross-attention
CONFIGS = ["dpfp2_sum", "dpfp2_delta_dec_align4_ul2"]
# (source lengths, target lengths) of a batch: block lengths 16, 32 and 64 (launch.block_t), lengths that are and are
# not multiples of 16, sources longer and shorter than their targets, with and without padding
BATCHES = [("15,10", "16,12"), ("23,23", "23,20"), ("40,40", "51,51"), ("64,50", "64,64")]


def launch_keys(*args):
    """The script's JSON: the launches, or the launches of each batch."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # Triton's JIT, not its interpreter
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / p) for p in ("", "tests"))  # factories.py
    proc = subprocess.run([sys.executable, str(KEYS), *args], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def as_keys(launches):
    return {tuple(key) for key in launches}


@pytest.mark.slow
def test_every_kernel_of_a_training_step_is_among_the_cached_launches():
    cached = as_keys(launch_keys("launches"))
    configs = bench_fairseq_gpu.configs()
    kernels = set()
    for name in CONFIGS:
        steps = launch_keys("model", ";".join(f"{src}/{tgt}" for src, tgt in BATCHES), *configs[name])
        for src, tgt in BATCHES:
            step = as_keys(steps[f"{src}/{tgt}"])
            assert step, f"{name} {src} {tgt}: no fused read"
            assert step <= cached, f"{name} {src} {tgt}: not cached: {sorted(k for k, _ in step - cached)}"
            kernels |= {kernel for kernel, _ in step}
    # every kernel of the benchmark's blocks: the sum rule's (plain and aligned), the delta rule's forward and backward
    assert {"sum_forward", "sum_backward_q", "sum_backward_kv", "delta_writes", "delta_output"} <= kernels
