"""CPU benchmark: the short read's kernel (csrc/cpu/feature_attend.cpp, the sum rule) of each feature map, forward and
backward, on one training call's shapes, side by side in one run.

    python -m fw_research.benchmarks.bench_reads_cpu                       # B 170, H 2, T 12, d 64 (a demo-preset call)
    python -m fw_research.benchmarks.bench_reads_cpu --maps favor hedgehog --batch 128 --tokens 16

Each map's read is the kernel alone (feature_attend_forward, then feature_attend_backward from a random gradient of
its weights), without autograd or the products with v: what bench_train_cpu.py's `--profile` lists as SumRead and
SumReadBackward. The maps take turns round by round, so that a change in the machine's load falls on all of them;
each time is the median over the rounds. Run it on two checkouts to compare their kernels (the numbers are
comparable only from the same machine and moment). Prints a Markdown table; --out writes it and a JSON beside it.
"""
import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from fw_fairseq.ops.common.z_column import Z_EPS
from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS, cpu_kernel
from fw_fairseq.ops.maps.favor_function import orthogonal_gaussian
from fw_research.benchmarks.bench_ops_cpu import machine_info

NU = {"dpfp": 2}  # the maps' nu (DPFP-2, d_dot 256); FAVOR+'s m is --favor-features (128: d_dot 256)


def calls(name, q, k, causal, m):
    """(forward, backward) of map `name`'s read of q, k [B, H, T, d]: callables with no arguments."""
    kernel = cpu_kernel(q)
    projection = orthogonal_gaussian(m, q.shape[-1], None, q.dtype) if name == "favor" else None
    code, nu = KERNEL_MAPS[name], NU.get(name, 0)
    weights, sums = kernel.feature_attend_forward(q, k, None, code, nu, projection, causal, Z_EPS, True)
    grad = torch.randn_like(weights)
    forward = lambda: kernel.feature_attend_forward(q, k, None, code, nu, projection, causal, Z_EPS, True)  # noqa
    backward = lambda: kernel.feature_attend_backward(grad, weights, sums, q, k, None, code, nu,  # noqa
                                                      projection, causal, Z_EPS, True)
    return forward, backward


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--maps", nargs="+", default=sorted(KERNEL_MAPS), choices=sorted(KERNEL_MAPS))
    parser.add_argument("--batch", type=int, default=170)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=12)
    parser.add_argument("--d-key", type=int, default=64)
    parser.add_argument("--favor-features", type=int, default=128)
    parser.add_argument("--causal", action="store_true", help="the decoder's self-attention (default: the encoder's)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out", type=Path, help="write OUT.md and OUT.json")
    args = parser.parse_args(argv)
    if cpu_kernel(torch.zeros(1)) is None:
        parser.error("fw_fairseq._cpu is not built: run `make setup` (or python setup.py build_ext --inplace)")
    torch.manual_seed(0)
    shape = (args.batch, args.heads, args.tokens, args.d_key)
    q, k = torch.randn(shape), torch.randn(shape)  # [B, H, T, d]
    runs = {name: calls(name, q, k, args.causal, args.favor_features) for name in args.maps}
    times = {name: ([], []) for name in args.maps}
    for round_ in range(args.rounds + 3):  # the first 3 rounds warm up
        for name, fns in runs.items():
            for fn, out in zip(fns, times[name]):
                start = time.perf_counter()
                fn()
                if round_ >= 3:
                    out.append(time.perf_counter() - start)
    rows = {name: [1e3 * statistics.median(t) for t in times[name]] for name in args.maps}
    info = machine_info() | {"threads": torch.get_num_threads(), "shape_BHTd": list(shape), "causal": args.causal,
                             "favor_features": args.favor_features, "rounds": args.rounds}
    lines = [f"{info['cpu_model']}, {info['threads']} threads, torch {info['torch']}; B H T d = {shape}, "
             f"{'causal' if args.causal else 'not causal'}, median of {args.rounds} rounds", "",
             "| map | forward ms | backward ms |", "|---|---:|---:|"]
    lines += [f"| {name} | {fwd:.2f} | {bwd:.2f} |" for name, (fwd, bwd) in rows.items()]
    print("\n".join(lines))
    if args.out:
        args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
        args.out.with_suffix(".json").write_text(json.dumps({"machine": info, "ms": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
