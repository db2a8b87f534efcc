"""Triton's kernel cache for the GPU node, filled without a GPU: the fused read's kernels (fw_fairseq/ops/fused_read)
compiled for the node's architecture, for the launches of the fused read benchmark's cases
(fw_research.experiments.fused_read_cases, fw_research.benchmarks.bench_fused_read_gpu).

    python -m fw_research.gpu_node.gpu_triton_cache --cache DIR                # here, no GPU: compile for sm_90
    python -m fw_research.gpu_node.gpu_triton_cache --cache DIR --device cuda  # on a GPU: the same launches, run

Triton's JIT finds a compiled kernel in TRITON_CACHE_DIR under a key made of Triton's own build (its files'
hashes), the kernel's source, its specialisation (argument dtypes, which integers are 1 or multiples of 16, which
pointers are 16-byte aligned), the compile options and the target (cuda, capability, warp size). None of that needs
a GPU. So here every launch of the fused read's forward and backward runs on CPU tensors through Triton's real JIT
path with OfflineDriver installed: it names the node's target and launches nothing, so each kernel is compiled
(by Triton's own ptxas) under the key the node computes for the same call on CUDA tensors of the same shapes, and
its limits are checked as the node's (shared memory, threads). The cache fits one Triton build only: the kit makes
it in the build venv (fw_research.gpu_node.gpu_prebuilt), which has the node's torch and Triton (gpu_node.txt).
Triton records a kernel's files by absolute path (__grp__*.json); relocate() points them at the folder the
cache is unpacked into. Only the cubin and the metadata are kept: the node loads nothing else.

Beside the benchmark's cases it compiles the fused reads that `transformer_fw_big --fp16` training takes in
fw_research.benchmarks.bench_fairseq_gpu's configurations (training_launches), so that a training run on the node starts
warm instead of compiling them in its first epoch.
"""
import argparse
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

KEEP = (".json", ".cubin")  # what a cache hit reads: the metadata, the group and the binary
SM90 = {"max_shared_mem": 232448, "multiprocessor_count": 132, "max_num_regs": 65536, "warpSize": 32}  # H100, H200


class OfflineDriver:
    """The part of Triton's active driver the JIT and a launch ask for, for a GPU that is not here: the target is
    cuda at `capability`; loading a binary and launching it do nothing."""

    def __init__(self, capability):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", capability, 32)
        self.utils = SimpleNamespace(get_device_properties=lambda device: dict(SM90),
                                     load_binary=lambda name, kernel, shared, device: (None, None, 0, 0, 1024))

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")

    @staticmethod
    def launcher_cls(src, metadata):
        return lambda *args, **kwargs: None


def launches(cases, rules, device):
    """Run the fused read forward and backward once for every case and rule of the benchmark: [labels]."""
    import torch

    from fw_research.experiments import fused_read_cases as bench
    from fw_fairseq.ops import feature_map
    from fw_fairseq.ops.rules.public import fused_read

    done = []
    for name in cases:
        case = bench.CASES[name]
        values = bench.make_inputs(case, device)
        for rule, causal in [(rule, causal) for rule, causal in bench.RULE_CASES if rule in rules]:
            phi = feature_map("dpfp", case["d"], nu=case["nu"]).to(device)
            q, k, v, *scalars = bench.leaves(values, rule, "head", bench.DTYPES[case["dtype"]])
            out = fused_read(phi, rule, q, k, v, tuple(scalars), causal, norm=bench.NORM[rule])
            out.backward(torch.ones_like(out))
            done.append(f"{name} {rule} {'causal' if causal else 'non-causal'}")
    return done


# transformer_fw_big --fp16 in bench_fairseq_gpu's configurations: 16 heads of 64, DPFP-2 (E = 256),
# fp16 heads and fp32 scalars. Each block as (rule, causal, phi's norm, --fw-cross-align P): the encoder's and the
# decoder's sum rule (and the cross-attention, Tq != T), the decoder's sum-normalised delta rule, the aligned
# cross-attention of P = 4.
TRAINING_HEADS = dict(H=16, d=64, nu=2)
TRAINING_BLOCKS = (("sum", False, None, 0), ("sum", True, None, 0), ("delta", True, "sum", 0), ("sum", False, None, 4))
# A kernel's compiled form depends on a length only through its block length (launch.block_t: 16, 32 or 64) and on
# whether it is a multiple of 16 (Triton's specialisation of integer arguments): one length of each class stands
# for every length. tests/scripts/test_gpu_triton_cache.py checks models' training steps against these launches.
TRAINING_LENGTHS = (15, 16, 31, 32, 63, 64)


def training_inputs(Tq, T, padded, device, rule):
    """Two sentences' fp16 heads q [2, H, Tq, d], k, v [2, H, T, d] (the second left-padded when `padded`), the
    key padding mask [2, T] or None, the rule's fp32 scalars [2, H, T] and the aligned read's angles."""
    import torch

    from fw_fairseq.ops import RULES

    H, d = TRAINING_HEADS["H"], TRAINING_HEADS["d"]
    q, k, v = (torch.randn(2, H, n, d, device=device, dtype=torch.float16).requires_grad_() for n in (Tq, T, T))
    mask = None
    if padded:
        mask = torch.zeros(2, T, dtype=torch.bool, device=device)
        mask[1, :T // 3] = True
    scalars = tuple(torch.rand(2, H, T, device=device) for _ in RULES[rule].scalars)
    angles = (torch.rand(2, Tq, device=device, dtype=torch.float64), torch.rand(2, T, device=device,
                                                                                dtype=torch.float64))
    return q, k, v, mask, scalars, angles


def training_launches(device):
    """Run every TRAINING_BLOCKS read that the dispatch sends to the fused read, forward and backward, at every pair
    of TRAINING_LENGTHS (Tq = T where causal), with and without padding: [labels]."""
    import torch

    from fw_fairseq.ops import RULES, feature_map
    from fw_fairseq.ops.fused_read import dispatch
    from fw_fairseq.ops.rules.raw_read import short_read

    dispatch.DEVICES = (device.type,)  # offline: CPU tensors stand for the node's CUDA ones
    phi = feature_map("dpfp", TRAINING_HEADS["d"], nu=TRAINING_HEADS["nu"]).to(device)
    done = []
    for rule, causal, norm, align in TRAINING_BLOCKS:
        pairs = [(n, n) for n in TRAINING_LENGTHS] if causal else [(a, b) for a in TRAINING_LENGTHS
                                                                   for b in TRAINING_LENGTHS]
        for (Tq, T), padded in [(pair, padded) for pair in pairs for padded in (False, True)]:
            q, k, v, mask, scalars, angles = training_inputs(Tq, T, padded, device, rule)
            if align:
                out = dispatch.fused_aligned_read_for(phi, RULES[rule], align, angles, q, k, v, mask)
            else:
                out = short_read(phi, RULES[rule], q, k, v, scalars, mask, causal, norm)
            if out is not None:
                out.backward(torch.ones_like(out))
                done.append(f"training {rule}{f' align {align}' if align else ''} "
                            f"{'causal' if causal else 'non-causal'} Tq={Tq} T={T}{' padded' if padded else ''}")
    return done


def relocate(cache):
    """Point every kernel group's file list (__grp__*.json) at `cache` as it is now, keeping the files that exist."""
    for group in Path(cache).glob("*/__grp__*.json"):
        paths = json.loads(group.read_text())["child_paths"]
        moved = {name: str(group.parent / Path(path).name) for name, path in paths.items()}
        kept = {name: path for name, path in moved.items() if Path(path).exists()}
        group.write_text(json.dumps({"child_paths": kept}))


def prune(cache):
    """Drop the intermediate representations (source, ttir, ttgir, llir, ptx): a cache hit reads none of them."""
    for path in Path(cache).glob("*/*"):
        if not path.name.endswith(KEEP):
            path.unlink()
    relocate(cache)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="TRITON_CACHE_DIR to fill")
    parser.add_argument("--cases", nargs="+", help="bench_fused_read_gpu.py's cases (default: its --quick ones)")
    parser.add_argument("--rules", nargs="+", default=["sum", "delta"], help="the benchmark's reads of these rules")
    parser.add_argument("--no-training", action="store_true", help="the benchmark's cases only, without the reads "
                        "of transformer_fw_big --fp16 training (training_launches)")
    parser.add_argument("--device", default="cpu", help="cpu: compile offline for --capability; cuda: run them")
    parser.add_argument("--capability", type=int, default=90, help="the node's GPU (90: H100, H200)")
    args = parser.parse_args(argv)
    args.cache.mkdir(parents=True, exist_ok=True)
    os.environ["TRITON_CACHE_DIR"] = str(args.cache.resolve())
    os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels, not the interpreter
    import torch
    import triton
    from triton.runtime import driver

    if args.device == "cpu":
        driver.set_active(OfflineDriver(args.capability))
    from fw_research.experiments import fused_read_cases as bench

    start = time.monotonic()
    done = launches(args.cases or bench.QUICK, args.rules, torch.device(args.device))
    if not args.no_training:
        done += training_launches(torch.device(args.device))
    if args.device == "cpu":
        prune(args.cache)
    kernels = sorted(p.name[len("__grp__"):-len(".json")] for p in args.cache.glob("*/__grp__*.json"))
    record = {"triton": triton.__version__, "device": args.device, "capability": args.capability, "launches": done,
              "kernels": len(kernels), "seconds": round(time.monotonic() - start, 1)}
    (args.cache / "fused_read_cache.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"gpu_triton_cache: {len(done)} reads, {len(kernels)} kernels in {args.cache} "
          f"(Triton {triton.__version__}, {record['seconds']} s)")


if __name__ == "__main__":
    main()
