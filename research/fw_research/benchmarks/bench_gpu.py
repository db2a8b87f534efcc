"""GPU benchmark: the fast weight kernels (csrc/cuda/) side by side with the alternatives, in one run.

    python -m fw_research.benchmarks.bench_gpu --quick  # 12 training and 6 decoding shapes (--T etc. still apply)
    python -m fw_research.benchmarks.bench_gpu          # the full grid (long: split it with the filters)
    python -m fw_research.benchmarks.bench_gpu --N 1024 --T 1024 2048 --E 512 --dtype bf16

Training (forward; backward alone, its forward untimed; forward+backward), per method:
  sum rule    ours_cuda (the public op, dispatching to fw_fairseq._cuda), ours_chunked
              (fw_fairseq.ops.common.chunking), fla_chunk (fla.ops.linear_attn.chunk_linear_attn, unnormalised),
              fast_transformers (causal_dot_product, float32 only)
  delta rule  ours_cuda, ours_chunked, fla_chunk (fla.ops.delta_rule.chunk_delta_rule, bf16 only),
              fla_recurrent (fused_recurrent_delta_rule)
  context     sdpa: PyTorch's causal softmax attention with head dim d
Each library gets its native layout (fla: [B, T, H, D]), built outside the timed region. Time is the
median over repeats between CUDA events after warm-up, with L2 flushed before each repeat; peak
memory is the allocator's high-water mark of one forward+backward above the inputs.
Shapes: d = M = 64, H = 8, N = B * H in {256, 1024}, T in {16, ..., 2048}, E in {64, 256, 512}.

Decoding (one token, state [N, E, M = d + 1] in float32 updated in place): ours (the rule's
{kernel}_step: sum_step / delta_step) and PyTorch eager ops, timed over CUDA-graph replays; the floor is the
state's bytes read and written (plus q, k, v, o) over the device-to-device copy bandwidth measured here.

Ratio columns are other / ours_cuda (> 1: ours is faster or smaller). A method that cannot run a
shape (missing package, dtype, limit, out of memory) gets its reason instead of numbers.
Writes benchmarks/results/bench_gpu_<device>[_quick].json: device, torch, CUDA, package versions.
"""
import argparse
import importlib
import inspect
import json
import re
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from fw_fairseq.ops import RULES, fast_weight_delta, fast_weight_sum
from fw_fairseq.ops.kernels.cuda_extension import cuda_kernel
from fw_fairseq.ops.rules.delta.chunked import chunked_delta
from fw_fairseq.ops.rules.sum.chunked import chunked_sum

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
D, HEADS = 64, 8


def optional(module, name):
    """module.name, or None if the package is not installed."""
    try:
        return getattr(importlib.import_module(module), name)
    except ImportError:
        return None


FLA_LINEAR = optional("fla.ops.linear_attn", "chunk_linear_attn")
FLA_DELTA = optional("fla.ops.delta_rule", "chunk_delta_rule")
FLA_RECURRENT = optional("fla.ops.delta_rule", "fused_recurrent_delta_rule")
FT_CAUSAL = optional("fast_transformers.causal_product", "causal_dot_product")
try:
    from fw_fairseq import _cuda as EXT
except ImportError:
    EXT = None


def version(name):
    try:
        return getattr(importlib.import_module(name), "__version__", "installed")
    except ImportError:
        return None


def fla_call(fn, q, k, v, **kw):
    """fla wants [B, T, H, D]; versions that still take head_first are told the layout."""
    if "head_first" in inspect.signature(fn).parameters:
        kw["head_first"] = False
    return fn(q, k, v, scale=1.0, **kw)[0]


def seq_first(*xs):
    return [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in xs]


# name -> (prepare(q, k, v, beta) -> args or a reason string, run(*args) -> output)
METHODS = {
    "sum": {
        "ours_cuda": (lambda q, k, v, b: (q, k, v), lambda q, k, v: fast_weight_sum(q, k, v)[0]),
        "ours_chunked": (lambda q, k, v, b: (q, k, v), lambda q, k, v: chunked_sum(q, k, v)[0]),
        "fla_chunk": (lambda q, k, v, b: seq_first(q, k, v) if FLA_LINEAR else "not installed",
                      lambda q, k, v: fla_call(FLA_LINEAR, q, k, v, normalize=False)),
        "fast_transformers": (lambda q, k, v, b: "not installed" if FT_CAUSAL is None
                              else "float32 only" if q.dtype != torch.float32 else (q, k, v),
                              lambda q, k, v: FT_CAUSAL(q, k, v)),
    },
    "delta": {
        "ours_cuda": (lambda q, k, v, b: (q, k, v, b), lambda q, k, v, b: fast_weight_delta(q, k, v, b)[0]),
        "ours_chunked": (lambda q, k, v, b: (q, k, v, b), lambda q, k, v, b: chunked_delta(q, k, v, b)[0]),
        "fla_chunk": (lambda q, k, v, b: "not installed" if FLA_DELTA is None
                      else "bf16 only" if q.dtype == torch.float32 else seq_first(q, k, v, b),
                      lambda q, k, v, b: fla_call(FLA_DELTA, q, k, v, beta=b)),
        "fla_recurrent": (lambda q, k, v, b: seq_first(q, k, v, b) if FLA_RECURRENT else "not installed",
                          lambda q, k, v, b: fla_call(FLA_RECURRENT, q, k, v, beta=b)),
    },
    "softmax": {
        "sdpa": (lambda q, k, v, b: (q, k, v),
                 lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    },
}


class Timer:
    """Median milliseconds of timed(setup()) between CUDA events, L2 flushed before each repeat."""

    def __init__(self, budget_ms, max_reps):
        self.budget_ms, self.max_reps = budget_ms, max_reps
        self.l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
        self.flush = torch.empty(2 * self.l2 // 4, dtype=torch.float32, device="cuda")

    def __call__(self, timed, setup=lambda: ()):
        timed(*setup())  # warm-up: autotuning, module load and handles stay out of the numbers
        torch.cuda.synchronize()
        times = []
        while len(times) < 3 or (sum(times) < self.budget_ms and len(times) < self.max_reps):
            args = setup()
            self.flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            timed(*args)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return statistics.median(times)


def make_inputs(N, T, E, M, dtype, seed=0):
    """Head-first leaves: q, k sum-normalised positive features, beta in (0, 1), v Gaussian."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    B = N // HEADS
    q = torch.rand(B, HEADS, T, E, device="cuda", generator=g)
    k = torch.rand(B, HEADS, T, E, device="cuda", generator=g)
    q, k = q / q.sum(-1, keepdim=True), k / k.sum(-1, keepdim=True)
    v = torch.randn(B, HEADS, T, M, device="cuda", generator=g)
    beta = torch.rand(B, HEADS, T, device="cuda", generator=g)
    return [x.to(dtype).requires_grad_() for x in (q, k, v, beta)]


def bench_training(timer, rule, method, N, T, E, dtype):
    """One record: fwd / bwd / fwd+bwd ms and peak MB, or the reason it could not run."""
    record = {"rule": rule, "method": method, "N": N, "T": T, "E": E, "M": D, "dtype": str(dtype)}
    prepare, run = METHODS[rule][method]
    try:
        args = prepare(*make_inputs(N, T, E, D, dtype))
        if isinstance(args, str):
            return {**record, "skipped": args}
        if method == "ours_cuda" and cuda_kernel(args[0], args[2], RULES[rule].kernel) is None:
            return {**record, "skipped": "fw_fairseq._cuda is not built or cannot run this shape"}
        upstream = torch.randn_like(run(*args))

        def fwd_bwd():
            torch.autograd.backward(run(*args), upstream)

        with torch.no_grad():
            record["fwd_ms"] = timer(lambda: run(*args))
        record["bwd_ms"] = timer(lambda out: torch.autograd.backward(out, upstream), setup=lambda: (run(*args),))
        record["fwd_bwd_ms"] = timer(fwd_bwd)
        for x in args:
            x.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        fwd_bwd()
        torch.cuda.synchronize()
        record["peak_MB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
    except torch.cuda.OutOfMemoryError:
        record = {**record, "skipped": "out of memory"}
    except Exception as err:  # an alternative's own limit (head dim, dtype): report it, go on
        record = {**record, "skipped": f"{type(err).__name__}: {str(err).splitlines()[0][:120]}"}
    torch.cuda.empty_cache()
    return record


def copy_bandwidth(timer, nbytes=1 << 30):
    """Device-to-device copy rate in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").normal_()
    dst = torch.empty_like(src)
    return 2 * nbytes / (timer(lambda: dst.copy_(src)) * 1e-3) / 1e9


def bench_step(timer, rule, impl, N, E, M, dtype, bandwidth, min_steps=20):
    """Per-token time of in-place decoding steps captured in one CUDA graph. The steps cycle
    through enough separate states to overflow L2 four times, so every state comes from DRAM, as
    it does in a decoder where the other layers run between two tokens of this one."""
    if impl == "ours" and EXT is None:
        return {"rule": rule, "impl": impl, "N": N, "E": E, "M": M, "skipped": "fw_fairseq._cuda is not built"}
    q, k, v, beta = [x.detach() for x in make_inputs(N, 1, E, M, dtype)]
    state_bytes = N * E * M * 4
    states = [torch.zeros(N // HEADS, HEADS, E, M, device="cuda") for _ in range(-(-4 * timer.l2 // state_bytes))]

    def eager(state):  # the same maths in PyTorch ops, float32 state
        qf, kf, vf = q.float(), k.float(), v.float()
        u = vf if rule == "sum" else beta.float()[..., None] * (vf - kf @ state)
        state.add_(kf.transpose(-1, -2) @ u)
        return (qf @ state).to(dtype)

    scalars = [beta][: len(RULES[rule].scalars)]  # the sum rule reads none, the delta rule beta

    def ours(state):
        return getattr(EXT, f"{RULES[rule].kernel}_step")(q, k, v, *scalars, state)

    step = {"ours": ours, "eager": eager}[impl]
    steps = max(min_steps, len(states))
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # graphs are captured off the default stream, after a warm-up
        step(states[0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(steps):
            step(states[i % len(states)])
    ms = timer(graph.replay) / steps
    nbytes = 2 * state_bytes + N * (2 * E + 2 * M) * q.element_size()
    floor_ms = nbytes / (bandwidth * 1e9) * 1e3
    return {"rule": rule, "impl": impl, "N": N, "E": E, "M": M, "dtype": str(dtype), "step_us": ms * 1e3,
            "floor_us": floor_ms * 1e3, "floor_fraction": floor_ms / ms}


def training_table(records, rule, dtype):
    dt = str(DTYPES[dtype])
    ours = {(r["N"], r["T"], r["E"]): r for r in records
            if r["method"] == "ours_cuda" and r["rule"] == rule and r["dtype"] == dt and "fwd_ms" in r}
    others = [m for m in METHODS[rule] if m != "ours_cuda"] + ["sdpa"]
    lines = [f"\n{rule} rule, {dtype}: ours_cuda ms (fwd / bwd / fwd+bwd), peak MB; others: fwd+bwd ms "
             "(x ours), peak MB (x ours)",
             f"{'N':>5} {'T':>5} {'E':>4} | {'ours_cuda':>28} | " + " | ".join(f"{m:>30}" for m in others)]
    for r in records:
        if r["method"] != "ours_cuda" or r["rule"] != rule or r["dtype"] != dt:
            continue
        key = (r["N"], r["T"], r["E"])
        cells = []
        for m in others:
            o = next(x for x in records if x["method"] == m and (x["N"], x["T"], x["E"]) == key
                     and x["dtype"] == r["dtype"] and x["rule"] in (rule, "softmax"))
            if "fwd_bwd_ms" not in o or key not in ours:
                cells.append(f"{o.get('skipped', '-')[:30]:>30}")
            else:
                u = ours[key]
                cells.append(f"{o['fwd_bwd_ms']:7.2f} (x{o['fwd_bwd_ms'] / u['fwd_bwd_ms']:5.2f}) "
                             f"{o['peak_MB']:6.0f} (x{o['peak_MB'] / max(u['peak_MB'], 1e-9):4.1f})")
        mine = (f"{r['fwd_ms']:6.2f} /{r['bwd_ms']:6.2f} /{r['fwd_bwd_ms']:6.2f} {r['peak_MB']:5.0f}"
                if "fwd_ms" in r else r.get("skipped", "")[:28])
        lines.append(f"{key[0]:>5} {key[1]:>5} {key[2]:>4} | {mine:>28} | " + " | ".join(cells))
    return "\n".join(lines)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="defaults for the options not given: N=256, T in {64, 256, 2048}, E in {64, 256}")
    parser.add_argument("--N", type=int, nargs="+")
    parser.add_argument("--T", type=int, nargs="+")
    parser.add_argument("--E", type=int, nargs="+")
    parser.add_argument("--dtype", nargs="+", choices=sorted(DTYPES), default=["bf16", "fp32"])
    parser.add_argument("--decode-N", type=int, nargs="+")
    parser.add_argument("--budget-ms", type=float, help="time budget per measurement (default 300, 100 with --quick)")
    parser.add_argument("--out", type=Path, help="JSON path (default: benchmarks/results/bench_gpu_<device>.json)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gpu.py needs a CUDA GPU; see benchmarks/README.md")
    # --quick: MT lengths (64, 256) and one long sequence; E = 256 is DPFP-2's width at d = 64 and fla's
    # chunked delta limit (E = 512 would time fla's recurrent backward at seconds per call); the
    # decoding target is read at N >= 1024. Options given on the command line win.
    grid = ({"N": [256], "T": [64, 256, 2048], "E": [64, 256], "decode_N": [256, 1024, 5000], "budget_ms": 100.0}
            if args.quick else {"N": [256, 1024], "T": [2**i for i in range(4, 12)], "E": [64, 256, 512],
                                "decode_N": [256, 1024, 5000], "budget_ms": 300.0})
    for name, default in grid.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
    return args


def report(training, decoding, bandwidth, dtypes):
    """The training tables per rule and dtype, and the decoding steps against their floor."""
    for dtype in dtypes:
        for rule in ("sum", "delta"):
            print(training_table(training, rule, dtype))
    print(f"\ndecoding step, float32 state, M = {D + 1}; floor = state read + write at {bandwidth:.0f} GB/s (copy)")
    print(f"{'rule':>5} {'impl':>5} {'N':>5} {'E':>4} {'us/token':>9} {'floor us':>9} {'of floor':>8}")
    for r in decoding:
        if "step_us" in r:
            print(f"{r['rule']:>5} {r['impl']:>5} {r['N']:>5} {r['E']:>4} {r['step_us']:9.1f} "
                  f"{r['floor_us']:9.1f} {r['floor_fraction']:8.2f}")
        else:
            print(f"{r['rule']:>5} {r['impl']:>5} {r['N']:>5} {r['E']:>4} {r['skipped']}")


def main():
    args = parse_args()
    device = torch.cuda.get_device_name()
    timer = Timer(args.budget_ms, max_reps=10 if args.quick else 30)
    slug = re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_")
    out = args.out or RESULTS / f"bench_gpu_{slug}{'_quick' if args.quick else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    versions = {name: version(name) for name in ("fla", "fast_transformers", "triton")}
    training, decoding = [], []
    bandwidth = copy_bandwidth(timer)

    def save():  # after every record: a run stopped by a time limit keeps what it measured
        out.write_text(json.dumps({"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
                                   "versions": versions, "copy_GBps": bandwidth, "args": vars(args) | {"out": str(out)},
                                   "training": training, "decoding": decoding}, indent=1))

    # the decoding step first: it needs no peer, while the training grid's first calls compile the peers'
    # Triton kernels (20-30 s per shape on an H100), so a run cut short by its time limit still has it
    for N in args.decode_N:
        for E in args.E:
            for rule in ("sum", "delta"):
                for impl in ("ours", "eager"):
                    decoding.append(bench_step(timer, rule, impl, N, E, D + 1, torch.float32, bandwidth))
                    save()
    for dtype in args.dtype:
        for N in args.N:
            for T in args.T:
                sdpa = bench_training(timer, "softmax", "sdpa", N, T, D, DTYPES[dtype])
                for E in args.E:
                    training.append({**sdpa, "E": E})
                    for rule in ("sum", "delta"):
                        for method in METHODS[rule]:
                            training.append(bench_training(timer, rule, method, N, T, E, DTYPES[dtype]))
                            print(json.dumps(training[-1]), flush=True)
                            save()
    report(training, decoding, bandwidth, args.dtype)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
