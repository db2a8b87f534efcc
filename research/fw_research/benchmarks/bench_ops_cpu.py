"""CPU benchmark: chunked vs naive fast weight ops (sum and delta rule), side by side in one run.

    python -m fw_research.benchmarks.bench_ops_cpu            # B=2, H=8, E=M=64, T in {128, 512, 2048}, float32
    python -m fw_research.benchmarks.bench_ops_cpu --quick    # T in {128, 512}, fewer repeats

Every configuration runs with 1 torch thread and with torch's default thread count (the machine's
cores, how a user runs it), unless --threads says otherwise. The naive loop's tiny per-position
ops cannot use a second thread; the chunked form's batched matmuls can, which is part of its point.

Time: median over --repeats of forward (no_grad) and forward+backward (random upstream gradient on
the output); naive and chunked alternate within each repeat so that load from other processes hits
both alike, and every timed call follows an untimed call of the same op, so that each is timed in
its own steady state, as in a training loop. (Without that, each op pays for the memory the other
just freed: the naive loop frees over 100 MiB per forward+backward, which the chunked forward
timed next paid for, mostly in page faults: about 1.5 ms of its 5 ms at T = 512 on the 2-core
machine.)

Peak memory of forward+backward: torch's CPU allocator sits on malloc, which tracemalloc cannot see, so each config runs in a fresh subprocess: it warms up on a short sequence (so that
lazily paged-in library code does not count), builds its inputs, resets the kernel's resident-set
high-water mark (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0) and reports VmHWM - VmRSS after
one forward+backward: the extra resident memory the step needed at its peak. The subprocess runs
with a fixed glibc mmap threshold so that freed large blocks go back to the OS instead of being
reused unseen from the heap.
Writes benchmarks/results/ops_cpu.json (ops_cpu_quick.json with --quick) and a Markdown table.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from fw_fairseq.ops import sum_normalize
from fw_fairseq.ops.common.chunking import DELTA_CHUNK_SIZE, DELTA_ONE_CHUNK_MAX, SUM_CHUNK_SIZE
from fw_fairseq.ops.rules.delta.chunked import chunked_delta
from fw_fairseq.ops.rules.delta.naive import naive_delta
from fw_fairseq.ops.rules.sum.chunked import chunked_sum
from fw_fairseq.ops.rules.sum.naive import naive_sum

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
TARGET_T, TARGET_SPEEDUP = 512, 10.0  # the chunked ops' target: >= 10x the naive loop at T = 512
IMPLS = {
    ("sum", "naive"): lambda q, k, v, beta: naive_sum(q, k, v)[0],
    ("sum", "chunked"): lambda q, k, v, beta: chunked_sum(q, k, v)[0],
    ("delta", "naive"): lambda q, k, v, beta: naive_delta(q, k, v, beta)[0],
    ("delta", "chunked"): lambda q, k, v, beta: chunked_delta(q, k, v, beta)[0],
}


def make_inputs(B, H, T, D, requires_grad):
    """Sum-normalised positive keys/queries [B, H, T, D], values [B, H, T, D], beta in (0, 1) [B, H, T]."""
    g = torch.Generator().manual_seed(0)
    q = sum_normalize(torch.rand(B, H, T, D, generator=g))
    k = sum_normalize(torch.rand(B, H, T, D, generator=g))
    v = torch.randn(B, H, T, D, generator=g)
    beta = torch.sigmoid(torch.randn(B, H, T, generator=g))
    return [x.requires_grad_(requires_grad) for x in (q, k, v, beta)]


def forward_only(fn, inputs):
    with torch.no_grad():
        fn(*inputs)


def forward_backward(fn, inputs, grad_out):
    o = fn(*inputs)
    torch.autograd.grad(o, inputs, grad_out, allow_unused=True)  # the sum rule has no beta


def time_config(rule, T, args):
    """Median milliseconds {impl: {"fwd": ms, "fwd_bwd": ms}} for one rule and length."""
    inputs = make_inputs(args.batch, args.heads, T, args.dim, requires_grad=True)
    grad_out = torch.randn_like(inputs[2])
    impls = ["chunked"] + (["naive"] if T <= args.naive_max_t else [])
    times = {impl: {"fwd": [], "fwd_bwd": []} for impl in impls}
    for repeat in range(args.repeats + 1):  # repeat 0 warms up and is discarded
        for impl in impls:
            fn = IMPLS[rule, impl]
            for key, step in (("fwd", lambda: forward_only(fn, inputs)),
                              ("fwd_bwd", lambda: forward_backward(fn, inputs, grad_out))):
                step()  # untimed: the timed call then finds the allocator as this op leaves it
                start = time.perf_counter()
                step()
                if repeat:
                    times[impl][key].append(1e3 * (time.perf_counter() - start))
    return {impl: {key: statistics.median(ms) for key, ms in t.items()} for impl, t in times.items()}


def _status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def memory_worker(rule, impl, T, args):
    """Runs in a subprocess: prints the extra peak resident MiB of one forward+backward."""
    torch.set_num_threads(args.threads)
    warmup = make_inputs(args.batch, args.heads, 16, args.dim, requires_grad=True)
    forward_backward(IMPLS[rule, impl], warmup, torch.randn_like(warmup[2]))
    del warmup
    inputs = make_inputs(args.batch, args.heads, T, args.dim, requires_grad=True)
    grad_out = torch.randn_like(inputs[2])
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS: imports and input creation do not count
    base = _status_kib("VmRSS")
    forward_backward(IMPLS[rule, impl], inputs, grad_out)
    print(json.dumps({"peak_mib": (_status_kib("VmHWM") - base) / 1024}))


def measure_memory(rule, impl, T, threads, args):
    cmd = [sys.executable, "-m", __spec__.name, "--memory-worker", rule, impl, str(T), "--threads", str(threads),
           "--batch", str(args.batch), "--heads", str(args.heads), "--dim", str(args.dim)]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")  # a fixed threshold: freed big blocks are unmapped
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def machine_info():
    cpu_model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
                     platform.processor())
    return {
        "device": "cpu", "cpu_model": cpu_model, "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "python": platform.python_version(),
        "load_average_1_5_15min": [round(x, 1) for x in os.getloadavg()], "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def table(rows):
    head = ("| threads | rule | T | naive fwd ms | chunked fwd ms | fwd speedup | naive fwd+bwd ms | chunked fwd+bwd ms "
            "| fwd+bwd speedup | naive peak MiB | chunked peak MiB | memory ratio |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        lines.append(
            f"| {r['threads']} | {r['rule']} | {r['T']} | {fmt(r['naive_fwd_ms'])} | {fmt(r['chunked_fwd_ms'])} "
            f"| {fmt(r['fwd_speedup'])}x | {fmt(r['naive_fwd_bwd_ms'])} | {fmt(r['chunked_fwd_bwd_ms'])} "
            f"| {fmt(r['fwd_bwd_speedup'])}x | {fmt(r['naive_peak_mib'])} | {fmt(r['chunked_peak_mib'])} "
            f"| {fmt(r['memory_ratio'])}x |"
        )
    return "\n".join(lines)


def ratio(a, b):
    return None if a is None or b is None or b <= 0 else a / b


def target_lines(rows):
    """One line per thread count: the speedups at TARGET_T against TARGET_SPEEDUP."""
    lines = []
    for threads in sorted({r["threads"] for r in rows}):
        parts = []
        for r in rows:
            if r["threads"] == threads and r["T"] == TARGET_T:
                for key, name in (("fwd_speedup", "fwd"), ("fwd_bwd_speedup", "fwd+bwd")):
                    x = r[key]
                    verdict = "-" if x is None else ("met" if x >= TARGET_SPEEDUP else "NOT met")
                    parts.append(f"{r['rule']} {name} {fmt(x)}x ({verdict})")
        if parts:
            lines.append(f"- {threads} thread(s), T={TARGET_T}, target >= {TARGET_SPEEDUP:g}x: " + ", ".join(parts))
    return lines


def measure_row(threads, rule, T, args, thread_counts, memory):
    """One row: the naive and chunked forms' times of `rule` at length T and, with the first thread count, their
    peak memory (it does not depend on the thread count; kept in `memory`)."""
    t = time_config(rule, T, args)
    naive = t.get("naive", {})
    # peak memory does not depend on the thread count: measured once, with the first
    if threads == thread_counts[0]:
        memory[rule, T] = {impl: None if args.no_memory or impl not in t
                           else measure_memory(rule, impl, T, threads, args)
                           for impl in ("naive", "chunked")}
    mem = memory[rule, T] if threads == thread_counts[0] else {"naive": None, "chunked": None}
    row = {"threads": threads, "rule": rule, "T": T,
           "naive_fwd_ms": naive.get("fwd"), "chunked_fwd_ms": t["chunked"]["fwd"],
           "naive_fwd_bwd_ms": naive.get("fwd_bwd"), "chunked_fwd_bwd_ms": t["chunked"]["fwd_bwd"],
           "naive_peak_mib": mem["naive"], "chunked_peak_mib": mem["chunked"]}
    row["fwd_speedup"] = ratio(row["naive_fwd_ms"], row["chunked_fwd_ms"])
    row["fwd_bwd_speedup"] = ratio(row["naive_fwd_bwd_ms"], row["chunked_fwd_bwd_ms"])
    row["memory_ratio"] = ratio(row["naive_peak_mib"], row["chunked_peak_mib"])
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="T in {128, 512}, 2 repeats")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    p.add_argument("--naive-max-t", type=int, default=10**9, help="skip the naive loop above this T")
    p.add_argument("--no-memory", action="store_true", help="skip the per-config memory subprocesses")
    p.add_argument("--threads", type=int, nargs="+",
                   help="torch intra-op thread counts to run (default: 1 and torch's default, %d here)"
                   % torch.get_num_threads())
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--dim", type=int, default=64, help="E = M")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="where the JSON and Markdown go")
    p.add_argument("--memory-worker", nargs=3, metavar=("RULE", "IMPL", "T"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_worker:
        rule, impl, T = args.memory_worker
        args.threads = args.threads[0]
        return memory_worker(rule, impl, int(T), args)
    if args.quick:
        args.lengths, args.repeats = [128, 512], 2
    thread_counts = args.threads or sorted({1, torch.get_num_threads()})

    rows, memory = [], {}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        for rule in ("sum", "delta"):
            for T in args.lengths:
                row = measure_row(threads, rule, T, args, thread_counts, memory)
                rows.append(row)
                print(table([row]).splitlines()[-1], flush=True)

    chunks = (f"chunk {SUM_CHUNK_SIZE} (sum) / {DELTA_CHUNK_SIZE} (delta; one chunk up to T = {DELTA_ONE_CHUNK_MAX})")
    config = {"B": args.batch, "H": args.heads, "E": args.dim, "M": args.dim, "dtype": "float32",
              "chunk_size": {"sum": SUM_CHUNK_SIZE, "delta": DELTA_CHUNK_SIZE, "delta_one_chunk_max": DELTA_ONE_CHUNK_MAX}, "threads": thread_counts,
              "repeats": args.repeats, "statistic": "median"}
    result = {"machine": machine_info(), "config": config, "rows": rows}
    name = "ops_cpu_quick" if args.quick else "ops_cpu"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    m = result["machine"]
    targets = "\n".join(target_lines(rows))
    md = (f"# Fast weight ops on CPU: chunked vs naive\n\n{m['cpu_model']}, {m['cpu_count']} CPUs, "
          f"torch {m['torch']}, load average {m['load_average_1_5_15min']}, {m['date']}; "
          f"B={args.batch}, H={args.heads}, E=M={args.dim}, float32, {chunks}, median of {args.repeats}.\n"
          f"Speedup = naive / chunked time; memory ratio = naive / chunked extra peak RSS of forward+backward "
          f"(measured once, with {thread_counts[0]} thread(s)).\n\n{table(rows)}\n\n{targets}\n")
    (args.out_dir / f"{name}.md").write_text(md)
    print("\n" + table(rows) + f"\n\n{targets}\n\nwrote {args.out_dir / name}.json and .md")


if __name__ == "__main__":
    main()
