"""Every compiled kernel once on small shapes, for compute-sanitizer (research/fw_research/gpu_node/gpu_check.sh runs it
under memcheck and racecheck). Not a benchmark and not a parity test (tests/cuda does that): it launches each
kernel instantiation the launchers pick (all column tiers by E, all row tiers by M, the step kernel's
block shapes, every dtype) so the sanitizer sees every one of them touch memory.

    compute-sanitizer --tool memcheck --error-exitcode 3 python -m fw_research.benchmarks.gpu_sanitize_cases
"""
import os

# one cudaMalloc per tensor: an overrun past a tensor's end then leaves its allocation, where memcheck
# sees it, instead of landing in the caching allocator's slack
os.environ.setdefault("PYTORCH_NO_CUDA_MEMORY_CACHING", "1")

import torch  # noqa: E402  (after the allocator setting)

from fw_fairseq import _cuda as EXT  # noqa: E402

# (B, H, T, E, M): E picks the column tier (16 .. 512), M the row tier (9, 33, 65, 100, 129) and the
# widest value width (160); T = 1 and odd T; E = 512 with M = 129 is the launchers' largest case
SHAPES = [(1, 2, 5, 16, 9), (2, 1, 3, 40, 33), (1, 2, 7, 64, 65), (1, 1, 4, 100, 100), (1, 1, 3, 200, 129),
          (1, 1, 2, 300, 160), (1, 1, 2, 512, 129), (2, 3, 1, 64, 65)]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def inputs(B, H, T, E, M, dtype):
    q = torch.rand(B, H, T, E, device="cuda", dtype=dtype)
    k = torch.rand(B, H, T, E, device="cuda", dtype=dtype)
    q, k = q / q.sum(-1, keepdim=True), k / k.sum(-1, keepdim=True)
    v = torch.randn(B, H, T, M, device="cuda", dtype=dtype)
    beta = torch.rand(B, H, T, device="cuda", dtype=dtype)
    alpha = 0.5 + 0.5 * torch.rand(B, H, T, device="cuda", dtype=dtype)
    state = 0.1 * torch.randn(B, H, E, M, device="cuda", dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    return q, k, v, beta, alpha, state


def main():
    launches = 0
    for dtype in DTYPES:
        for shape in SHAPES:
            q, k, v, beta, alpha, s0 = inputs(*shape, dtype)
            # the binding reads do [B, H, T, M] in the input dtype (v's), dstate_final in the state dtype
            do, ds = torch.randn_like(v), torch.randn_like(s0)
            EXT.sum_forward(q, k, v, s0)
            EXT.sum_backward(q, k, v, s0, do, ds)
            EXT.delta_forward(q, k, v, beta, s0)
            EXT.delta_backward(q, k, v, beta, s0, do, ds)
            EXT.gated_delta_forward(q, k, v, beta, alpha, s0)
            EXT.gated_delta_backward(q, k, v, beta, alpha, s0, do, ds)
            step = [x[:, :, :1].contiguous() for x in (q, k, v, beta, alpha)]
            EXT.sum_step(*step[:3], s0.clone())
            EXT.delta_step(*step[:4], s0.clone())
            EXT.gated_delta_step(*step, s0.clone())
            launches += 9
            torch.cuda.synchronize()  # a kernel fault is reported at the case that caused it
    print(f"gpu_sanitize_cases: {launches} extension calls over {len(SHAPES)} shapes x {len(DTYPES)} dtypes")


if __name__ == "__main__":
    main()
