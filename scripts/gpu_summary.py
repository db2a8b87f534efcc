"""Render a GPU check's output folder as Markdown: python3 scripts/gpu_summary.py OUT_DIR [--print-only].

Reads what scripts/gpu_check.py leaves there (check.json with environment.json, bench_gpu.json,
bench_fairseq.json; any may be missing when a step failed), writes OUT_DIR/summary.md and prints it:
the machine and versions, every step's status, and each target of the GPU issue with its measured value
and a verdict (met / missed / no data).
"""
import argparse
import json
import re
import statistics
from pathlib import Path

T_MT = 256  # "MT lengths": the training-op targets are read at T <= this
DECODE_MIN_N = 1024  # the decoding-step target is read at N >= this


def load(path):
    return json.loads(path.read_text()) if path.exists() else None


def verdict(ok):
    return "no data" if ok is None else ("met" if ok else "missed")


def fwd_bwd(records, rule, method, dtype):
    """{(N, T, E): fwd+bwd ms} of one method's successful runs."""
    return {(r["N"], r["T"], r["E"]): r["fwd_bwd_ms"] for r in records
            if r["rule"] == rule and r["method"] == method and r["dtype"] == dtype and "fwd_bwd_ms" in r}


def ops_targets(bench):
    """(target, value, verdict) rows from bench_gpu.json."""
    rows = []
    if bench is None:
        return [("training ops and decoding step (bench_gpu.py)", "no results", verdict(None))]
    training, decoding = bench["training"], bench["decoding"]
    for dtype in ("torch.bfloat16", "torch.float32"):
        short = "bf16" if "bfloat16" in dtype else "fp32"
        ours = {k: v for k, v in fwd_bwd(training, "delta", "ours_cuda", dtype).items() if k[1] <= T_MT and k[2] == 64}
        fla = [fwd_bwd(training, "delta", m, dtype) for m in ("fla_chunk", "fla_recurrent")]
        ratios = [min(f[k] for f in fla if k in f) / ms for k, ms in ours.items() if any(k in f for f in fla)]
        rows.append((f"delta, {short}, E = d = 64, T <= {T_MT}: fla's best delta kernel / ours >= 1.5",
                     ", ".join(f"{r:.2f}x" for r in ratios) or ("ours only (fla cannot run it)" if ours else "no runs"),
                     verdict(min(ratios) >= 1.5 if ratios else None)))
        ours = {k: v for k, v in fwd_bwd(training, "sum", "ours_cuda", dtype).items() if k[1] <= T_MT and k[2] == 64}
        ft = fwd_bwd(training, "sum", "fast_transformers", dtype)
        ratios = [ft[k] / ms for k, ms in ours.items() if k in ft]
        rows.append((f"sum, {short}, E = d = 64, T <= {T_MT}: fast-transformers / ours >= 2",
                     ", ".join(f"{r:.2f}x" for r in ratios) or "no common runs", verdict(min(ratios) >= 2 if ratios else None)))
    for rule in ("sum", "delta"):
        runs = [r for r in training if r["rule"] == rule and r["method"] == "ours_cuda" and r["E"] == 512]
        ok = [r for r in runs if "fwd_bwd_ms" in r]
        rows.append((f"{rule}: E = 512 runs on the kernel", f"{len(ok)} of {len(runs)} shapes",
                     verdict(len(ok) == len(runs) if runs else None)))
    steps = [r for r in decoding if r["impl"] == "ours" and r["N"] >= DECODE_MIN_N and "floor_fraction" in r]
    worst = min((1 / r["floor_fraction"] for r in steps), default=None)
    rows.append((f"decoding step, N >= {DECODE_MIN_N}: time <= 1.5x the state read+write floor",
                 f"worst {worst:.2f}x the floor over {len(steps)} shapes" if worst else "no runs",
                 verdict(worst <= 1.5 if worst else None)))
    return rows


def fairseq_targets(bench):
    if bench is None:
        return [("transformer_fw_big DPFP-2 --fp16: train words/s >= 1.0x softmax", "no results", verdict(None))]
    rows = []
    for name in ("dpfp2_sum", "dpfp2_delta"):
        ratio = bench["configs"].get(name, {}).get("vs_softmax", {}).get("train_wps")
        rows.append((f"{bench['args']['arch']} {name} --fp16: train words/s >= 1.0x softmax",
                     f"{ratio:.2f}x" if ratio else "no run", verdict(ratio >= 1.0 if ratio else None)))
    return rows


def check_targets(check):
    """Sanitizers clean and every tests/cuda case passing, read from the steps' recorded output."""
    steps = {s["name"]: s for s in check["steps"]} if check else {}
    rows = []
    for tool in ("memcheck", "racecheck"):
        step = steps.get(tool)
        # memcheck ends "ERROR SUMMARY: 0 errors", racecheck "RACECHECK SUMMARY: 0 hazards displayed (0 errors, ..."
        match = re.search(r"SUMMARY: .*?(\d+) error", step["tail"]) if step else None
        value = f"{match.group(1)} errors" if match else (step["status"] if step else "not run")
        rows.append((f"compute-sanitizer --tool {tool}: no error", value,
                     verdict(match.group(1) == "0" and step["status"] == "ok" if match else None)))
    step = steps.get("pytest_cuda")
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", step["tail"])) if step else {}
    rows.append(("pytest tests/cuda: every case passes", ", ".join(f"{n} {k}" for k, n in counts.items()) or
                 (step["status"] if step else "not run"),
                 verdict(step["status"] == "ok" and counts.get("passed", 0) > 0 if counts else None)))
    return rows


def fairseq_table(bench):
    lines = []
    if bench is None:
        return lines
    lengths = sorted({g["length"] for c in bench["configs"].values() for g in c.get("generate", [])})
    lines += [f"\nfairseq end to end ({bench['args']['arch']}, {bench['device']}): train words/s and "
              f"generate tokens/s at beam {bench['args']['beam']}, each x softmax\n",
              "| config | train words/s | train peak MiB | " + " | ".join(f"generate N={n}" for n in lengths) + " |",
              "|---|---:|---:|" + "---:|" * len(lengths)]
    for name, c in bench["configs"].items():
        tr, vs = c.get("train", {}), c.get("vs_softmax", {})
        wps = f"{tr['wps_median']:.0f} (x{vs.get('train_wps') or 0:.2f})" if tr.get("wps_median") else "-"
        peak = f"{tr['peak_MiB']:.0f}" if tr.get("peak_MiB") else "-"
        gen = {g["length"]: g for g in c.get("generate", [])}
        cells = [f"{gen[n]['tokens_per_s']:.0f} (x{vs['generate_tokens_per_s'].get(str(n)) or 0:.2f})"
                 if n in gen else "-" for n in lengths]
        lines.append(f"| {name} | {wps} | {peak} | " + " | ".join(cells) + " |")
    lines += [f"- not run: {line.splitlines()[0]}" for line in bench.get("not_run", [])]
    return lines


def ops_table(bench):
    """Median fwd+bwd ratio of each method to ours_cuda per (rule, dtype), over the shapes both ran."""
    if bench is None:
        return []
    lines = ["\ntraining ops (bench_gpu.py): other / ours_cuda fwd+bwd time, median over shared shapes "
             "(> 1: ours faster)\n", "| rule | dtype | method | shapes | median ratio |", "|---|---|---|---:|---:|"]
    training = bench["training"]
    for rule in ("sum", "delta"):
        for dtype in sorted({r["dtype"] for r in training}):
            ours = fwd_bwd(training, rule, "ours_cuda", dtype)
            for method in sorted({r["method"] for r in training if r["rule"] == rule} - {"ours_cuda"}):
                other = fwd_bwd(training, rule, method, dtype)
                ratios = [other[k] / ours[k] for k in ours if k in other]
                if ratios:
                    lines.append(f"| {rule} | {dtype.replace('torch.', '')} | {method} | {len(ratios)} | "
                                 f"{statistics.median(ratios):.2f} |")
    return lines


def shapes_table(bench):
    """Every shape's fwd+bwd ms (and peak MB) per method, with softmax SDPA beside them: the medians above
    hide where the kernels win and where they lose."""
    if bench is None or not bench["training"]:
        return []
    training = bench["training"]
    methods = ["ours_cuda", "ours_chunked", "fla_chunk", "fla_recurrent", "fast_transformers"]
    lines = ["\ntraining ops per shape: fwd+bwd ms (peak MB); '-' where a method did not run\n",
             "| rule | dtype | N | T | E | " + " | ".join(methods) + " | sdpa |", "|---" * 5 + "|---:" * 6 + "|"]
    for rule in ("sum", "delta"):
        for key in dict.fromkeys((r["dtype"], r["N"], r["T"], r["E"]) for r in training if r["rule"] == rule):
            runs = {r["method"]: r for r in training if (r["dtype"], r["N"], r["T"], r["E"]) == key
                    and r["rule"] in (rule, "softmax")}
            cells = [f"{runs[m]['fwd_bwd_ms']:.2f} ({runs[m]['peak_MB']:.0f})" if "fwd_bwd_ms" in runs.get(m, {})
                     else "-" for m in methods + ["sdpa"]]
            lines.append(f"| {rule} | {key[0].replace('torch.', '')} | {key[1]} | {key[2]} | {key[3]} | "
                         + " | ".join(cells) + " |")
    return lines


def render(out):
    check = load(out / "check.json")
    env = (check or {}).get("environment") or load(out / "environment.json") or {}
    lines = ["# GPU check", "",
             f"- device: {env.get('device') or env.get('nvidia_smi') or 'unknown'} (driver and memory: "
             f"{env.get('nvidia_smi') or 'unknown'}), capability {env.get('capability', '?')}",
             f"- torch {env.get('torch', '?')}, CUDA {env.get('cuda', '?')}, Python {env.get('python', '?')}, "
             f"nvcc {' '.join(env.get('nvcc') or ['?'])}",
             f"- commit {(check or {}).get('commit') or 'unknown'}, part {(check or {}).get('part', '?')}, "
             f"started {(check or {}).get('started', '?')}", "", "| step | status | seconds | last line |",
             "|---|---|---:|---|"]
    for s in (check or {}).get("steps", []):
        last = (s["tail"].strip().splitlines() or [""])[-1].replace("|", "/")[:100]
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']:.0f} | {last} |")
    targets = check_targets(check) + ops_targets(load(out / "bench_gpu.json")) + fairseq_targets(load(out / "bench_fairseq.json"))
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {v} | {ok} |" for t, v, ok in targets]
    lines += ops_table(load(out / "bench_gpu.json")) + shapes_table(load(out / "bench_gpu.json")) + fairseq_table(load(out / "bench_fairseq.json"))
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder scripts/gpu_check.sh wrote")
    parser.add_argument("--print-only", action="store_true", help="do not write summary.md")
    args = parser.parse_args()
    if not args.out.is_dir():
        raise SystemExit(f"gpu_summary: {args.out} is not a folder")
    text = render(args.out)
    if not args.print_only:
        (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
