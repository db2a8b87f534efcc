"""The fused read (fw_fairseq.ops.fused_read; the public entry fw_fairseq.ops.rules.public.fused_read) against the path it replaces and flash-linear-attention, on a GPU.

    python -m fw_research.benchmarks.bench_fused_read_gpu --quick --out bench_fused_read.json  # QUICK's four cases
    python -m fw_research.benchmarks.bench_fused_read_gpu --cases mt t256 --out ...
    TRITON_INTERPRET=1 python -m fw_research.benchmarks.bench_fused_read_gpu --device cpu --cases tiny --out ...

Each method goes from the raw heads q, k [B, H, T, d], v [B, H, T, M] (and beta [B, H, T]) to the read, forward
and backward (fwd+bwd: the output's backward against a fixed random upstream gradient):
- ours: fused_read(phi, rule, q, k, v, scalars, causal, norm), phi formed on chip, never in memory;
- old: what the attention module did before it: heads to float32 (the module computed the read in float32 under
  --fp16), phi materialised (phi.normalized for the delta rule), then fast_weight_attend (non-causal) or the rule's
  causal op (RULES[rule].causal; the compiled kernels where fw_fairseq._cuda is built), the sum rule through its
  z column (append_z_column, divide_by_z);
- fla_chunk, fla_recurrent (the delta rule only): flash-linear-attention's chunk_delta_rule and
  fused_recurrent_delta_rule fed with materialised, normalised features in their [B, T, H, *] layout (the heads
  are laid out so outside the timed region; the feature map and its normalisation are timed).
Rules: sum (non-causal and causal) and delta (causal, phi L2-normalised: the shipped configuration).

Timing: triton.testing.do_bench's median (L2 flushed between repeats) after untimed calls, so that Triton's
compilation stays out of the numbers (first_call_ms keeps the first call's time: compiling, or loading from Triton's
cache); the kernels' block shapes are fixed (no autotuning; fla autotunes its own). Ratios are other / ours
(> 1: ours is faster); "fla" is the faster of fla's two kernels. Correctness, beside each timing: the output and
every input gradient against the old path in float64 on the same inputs, as max |x - ref| / max |ref|, computed
after the allocator's free memory was filled with NaN (an element a kernel never writes reads NaN). A method that
cannot run a case records why: "not available" (not importable), "refused" (its own check or limit).
On a CPU (--device cpu, the tests) the timings are time.perf_counter medians and mean nothing.
"""
import argparse
import importlib
import importlib.util
import inspect
import json
import statistics
import time
from pathlib import Path

import torch

from fw_fairseq.ops import RULES, append_z_column, divide_by_z, fast_weight_attend, feature_map
from fw_research.experiments.fused_read_cases import (CASES, DTYPES, NORM, QUICK, RULE_CASES, in_layout, leaves,
                                                     make_inputs, rel_err)

TOLERANCE = {"bf16": 5e-2, "fp16": 5e-2, "fp32": 1e-3, "fp64": 1e-9}  # max relative error, output and gradients


def optional(module, name):
    """(module.name, None), or (None, why it is not available)."""
    try:
        return getattr(importlib.import_module(module), name), None
    except Exception as err:  # ImportError, or a package that fails on import: record it, go on
        return None, f"not available: {type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"


def features(phi, x, is_query, norm):
    return phi(x, is_query=is_query) if norm is None else phi.normalized(x, is_query, norm)


def old_read(phi, rule, causal, norm):
    def run(q, k, v, *scalars):
        dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
        q, k, v, *scalars = (x.to(dtype) for x in (q, k, v, *scalars))
        fq, fk = features(phi, q, True, norm), features(phi, k, False, norm)
        if RULES[rule].z_column:
            v = append_z_column(v)
        o = RULES[rule].causal(fq, fk, v, *scalars)[0] if causal else fast_weight_attend(fq, fk, v, *scalars)
        return divide_by_z(o) if RULES[rule].z_column else o
    return run


def method(name, phi, rule, causal, norm, dtype):
    """(run(*inputs) -> output, layout of inputs and output: "head" or "seq"), or the reason it cannot run."""
    if name == "old":
        return old_read(phi, rule, causal, norm), "head"
    if name == "ours":
        fused_read, why = optional("fw_fairseq.ops.rules.public", "fused_read")
        return why or ((lambda q, k, v, *s: fused_read(phi, rule, q, k, v, s, causal, norm=norm)), "head")
    if rule != "delta" or not causal:
        return "fla has no such read"
    fn, why = optional("fla.ops.delta_rule", {"fla_chunk": "chunk_delta_rule",
                                              "fla_recurrent": "fused_recurrent_delta_rule"}[name])
    if why:
        return why
    if name == "fla_chunk" and dtype not in (torch.float16, torch.bfloat16):
        return "refused: fla's chunked delta kernel takes half inputs only (not called, as in bench_gpu.py)"
    extra = {"head_first": False} if "head_first" in inspect.signature(fn).parameters else {}

    def run(q, k, v, beta):
        return fn(features(phi, q, True, norm), features(phi, k, False, norm), v, beta, scale=1.0, **extra)[0]
    return run, "seq"


def head_first(x, layout):
    return x.transpose(1, 2) if layout == "seq" else x


def poison(device, nbytes=1 << 30):
    """Fill 1 GiB of the CUDA allocator's otherwise empty cache with NaN and free it, so that the next call's
    buffers come from it: an output element a kernel never writes then reads NaN."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        block = torch.full((nbytes // 4,), float("nan"), device=device)
        del block


def reference(phi, rule, causal, norm, values, upstream):
    """The old path in float64: (output, gradients of q, k, v and the scalars), all head-first."""
    xs = leaves(values, rule, "head", torch.float64)
    out = old_read(phi, rule, causal, norm)(*xs)
    out.backward(upstream.double())
    return out.detach(), [x.grad for x in xs]


def check(run, layout, xs, upstream, ref):
    """(max relative error of the output and of the gradients against the float64 reference, the output's dtype)."""
    poison(upstream.device)
    out = run(*xs)
    out.backward(in_layout(upstream, layout).to(out.dtype))
    grads = [None if x.grad is None else head_first(x.grad, layout) for x in xs]
    return {"out": rel_err(head_first(out.detach(), layout), ref[0]),
            "grads": max(rel_err(g, r) for g, r in zip(grads, ref[1]))}, out.dtype


def timer(step, xs, device, reps):
    """Median ms of step() after one untimed call: do_bench on CUDA, perf_counter on a CPU."""
    step()
    if device.type == "cuda":
        import triton.testing

        torch.cuda.synchronize()
        return triton.testing.do_bench(step, warmup=25, rep=100, grad_to_none=xs, return_mode="median")
    times = []
    for _ in range(reps):
        for x in xs:
            x.grad = None
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure(name, case, phi, rule, causal, values, upstream, ref, device, reps):
    """One method on one case and rule: fwd+bwd ms, peak MB and its errors, or why it did not run."""
    dtype = DTYPES[case["dtype"]]
    made = method(name, phi, rule, causal, NORM[rule], dtype)
    if isinstance(made, str):
        return {"skipped": made}
    run, layout = made
    try:
        xs = leaves(values, rule, layout, dtype)
        start = time.perf_counter()
        error, out_dtype = check(run, layout, xs, upstream, ref)  # the first call: it compiles (or loads) kernels
        if device.type == "cuda":
            torch.cuda.synchronize()
        record = {"error": error, "first_call_ms": (time.perf_counter() - start) * 1e3}
        out_grad = in_layout(upstream, layout).to(out_dtype)

        def step():
            torch.autograd.backward(run(*xs), out_grad)

        record["fwd_bwd_ms"] = timer(step, xs, device, reps)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            step()
            torch.cuda.synchronize()
            record["peak_MB"] = (torch.cuda.max_memory_allocated() - base) / 2**20
        tol = TOLERANCE[case["dtype"]]
        record["correct"] = max(record["error"].values()) <= tol  # NaN compares False
        return record
    except torch.cuda.OutOfMemoryError:
        return {"skipped": "out of memory"}
    except Exception as err:  # a method's own refusal (shape, dtype, limit): record it, go on
        return {"skipped": f"refused: {type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"}
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()


def ratios(methods):
    """old / ours and fla's best / ours fwd+bwd time (> 1: ours is faster)."""
    ours = methods["ours"].get("fwd_bwd_ms")
    fla = [methods[m]["fwd_bwd_ms"] for m in ("fla_chunk", "fla_recurrent") if "fwd_bwd_ms" in methods.get(m, {})]
    old = methods["old"].get("fwd_bwd_ms")
    return {"old_over_ours": old / ours if ours and old else None,
            "fla_over_ours": min(fla) / ours if ours and fla else None}


def bench_case(name, device, reps):
    """Every rule and method on one case: yields a record per rule."""
    case = CASES[name]
    values = make_inputs(case, device)
    for rule, causal in RULE_CASES:
        phi = feature_map("dpfp", case["d"], nu=case["nu"]).to(device)
        upstream = torch.randn(values[2].shape, generator=torch.Generator().manual_seed(1)).to(device)
        ref = reference(phi, rule, causal, NORM[rule], values, upstream)
        methods = {m: measure(m, case, phi, rule, causal, values, upstream, ref, device, reps)
                   for m in ("ours", "old", "fla_chunk", "fla_recurrent")}
        record = {"case": name, **case, "E": 2 * case["d"] * case["nu"], "rule": rule, "causal": causal,
                  "norm": NORM[rule], "methods": methods, **ratios(methods)}
        print(json.dumps(record), flush=True)
        yield record


def table(records):
    lines = [f"{'case':<10} {'rule':<6} {'causal':<6} {'ours ms':>9} {'err':>8} {'old ms':>8} {'x old':>6} "
             f"{'fla ms':>8} {'x fla':>6}"]
    for r in records:
        m = r["methods"]
        fla = [m[k]["fwd_bwd_ms"] for k in ("fla_chunk", "fla_recurrent") if "fwd_bwd_ms" in m[k]]
        ours = f"{m['ours']['fwd_bwd_ms']:9.3f} {max(m['ours']['error'].values()):8.1e}" if "fwd_bwd_ms" in m[
            "ours"] else f"{m['ours'].get('skipped', '-')[:18]:>18}"
        lines.append(f"{r['case']:<10} {r['rule']:<6} {str(r['causal']):<6} {ours} "
                     f"{m['old'].get('fwd_bwd_ms', float('nan')):8.3f} {r['old_over_ours'] or 0:6.2f} "
                     f"{min(fla) if fla else float('nan'):8.3f} {r['fla_over_ours'] or 0:6.2f}")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"the cases {', '.join(QUICK)}")
    parser.add_argument("--cases", nargs="+", choices=list(CASES), help="default: every case but tiny")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (timings mean nothing)")
    parser.add_argument("--reps", type=int, default=3, help="timed calls per measurement on a CPU")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_fused_read_gpu: torch sees no CUDA device; --device cpu runs the smoke test")
    cases = args.cases or (QUICK if args.quick else [c for c in CASES if c != "tiny"])
    versions = {name: getattr(importlib.import_module(name), "__version__", "installed") if
                importlib.util.find_spec(name) else None for name in ("triton", "fla")}
    result = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "cuda": torch.version.cuda, "versions": versions, "cases": cases,
              "tolerance": TOLERANCE, "records": []}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for name in cases:
        for record in bench_case(name, device, args.reps):
            result["records"].append(record)
            args.out.write_text(json.dumps(result, indent=1) + "\n")  # after every read: a cut run keeps what it did
    print(table(result["records"]))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
