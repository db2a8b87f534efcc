"""Render a GPU check's output folder as Markdown: python -m fw_research.gpu_node.gpu_summary OUT_DIR [--print-only].

Reads what fw_research.gpu_node.gpu_check leaves there (check.json with environment.json, bench_gpu.json,
bench_fused_read.json, bench_fairseq.json; any may be missing when a step failed), writes OUT_DIR/summary.md and
prints it: the machine and versions, every step's status, and each GPU target with its measured value and a
verdict (met / missed / no data). A run whose check had no fused-read step (older runs) gets no fused-read rows.
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


# (configuration, its floor of steady-state train words/s over softmax's): the translation defaults with their
# criterion, Table 1's DPFP-2 row and the DPFP-2 sum rule at least as fast as softmax, the delta rule in the decoder
# with the plain read of the source (dpfp2_delta_dec) within 5%
FAIRSEQ_FLOORS = (("dpfp2_delta_dec_align4_ul2", 1.0), ("table1_dpfp_nu2", 1.0), ("dpfp2_sum", 1.0),
                  ("dpfp2_delta_dec", 0.95))


def fairseq_targets(bench):
    if bench is None:
        return [("transformer_fw_big DPFP-2 --fp16: train words/s >= 1.0x softmax", "no results", verdict(None))]
    arch, steady, rows = bench["args"]["arch"], "steady_state_rule" in bench, []
    vs = {name: bench["configs"].get(name, {}).get("vs_softmax", {}) for name, _ in FAIRSEQ_FLOORS}
    for name, floor in FAIRSEQ_FLOORS:
        ratio = vs[name].get("train_wps") if steady else None
        value = (f"{ratio:.2f}x" if ratio else "no run") if steady else "no steady-state run (an older benchmark)"
        rows.append((f"{arch} {name} --fp16: steady-state train words/s >= {floor:.2f}x softmax", value,
                     verdict(ratio >= floor if ratio else None)))
    memory = {name: v["peak_memory"] for name, v in vs.items() if v.get("peak_memory")}
    over = any(r > 1.0 for r in memory.values())
    rows.append((f"{arch} --fp16: train peak memory <= softmax's ({', '.join(n for n, _ in FAIRSEQ_FLOORS)})",
                 ", ".join(f"{n} {r:.2f}x" for n, r in memory.items()) or "no runs",
                 verdict(False if over else (True if len(memory) == len(FAIRSEQ_FLOORS) else None))))
    return rows


def fused_targets(bench, ran):
    """Rows from bench_fused_read.json; none where the check had no fused-read step (`ran`) and left no file."""
    if bench is None:
        return [("fused read (bench_fused_read_gpu.py)", "no results", verdict(None))] if ran else []
    records, rows = bench["records"], []
    for label, pick, floor in (("MT shapes (T <= 64)", lambda r: r["T"] <= 64, 3.0),
                               ("T = 256", lambda r: r["T"] == 256, 1.5)):
        ratios = [r["fla_over_ours"] for r in records if r["rule"] == "delta" and r["dtype"] == "bf16"
                  and r["E"] <= 256 and pick(r) and r.get("fla_over_ours")]
        rows.append((f"delta, bf16, {label}: fla's best delta kernel / fused read >= {floor}",
                     ", ".join(f"{x:.2f}x" for x in ratios) or "no common runs",
                     verdict(min(ratios) >= floor if ratios else None)))
    for label, pick in (("fp32", lambda r: r["dtype"] == "fp32"), ("E = 512", lambda r: r["E"] == 512)):
        runs = [r for r in records if pick(r)]
        ok = [r for r in runs if r["methods"]["ours"].get("correct")]
        fla = sorted({r["methods"]["fla_chunk"].get("skipped", "ran").split(":")[0] for r in runs
                      if r["rule"] == "delta"})
        rows.append((f"fused read runs {label}, every rule, within tolerance", f"{len(ok)} of {len(runs)} reads "
                     f"(fla's chunked kernel: {', '.join(fla) or '-'})",
                     verdict(len(ok) == len(runs) if runs else None)))
    ok = [r for r in records if r["methods"]["ours"].get("correct")]
    rows.append(("fused read within tolerance of float64, output and gradients, every case",
                 f"{len(ok)} of {len(records)} reads", verdict(len(ok) == len(records) if records else None)))
    return rows


def fused_table(bench):
    if bench is None or not bench["records"]:
        return []
    lines = [f"\nfused read (bench_fused_read_gpu.py, {bench['device']}): fwd+bwd ms, max relative error against "
             "float64; old and fla: ms (x fused read); first call: ms of the untimed call (compile or cache)\n",
             "| case | dtype | T | E | rule | causal | fused read | error | first call | old | fla |",
             "|---|---|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in bench["records"]:
        m, fla = r["methods"], [r["methods"][k] for k in ("fla_chunk", "fla_recurrent")]
        best = min((f["fwd_bwd_ms"] for f in fla if "fwd_bwd_ms" in f), default=None)
        ours = m["ours"]
        cells = [f"{ours['fwd_bwd_ms']:.3f}", f"{max(ours['error'].values()):.1e}", f"{ours['first_call_ms']:.0f}"] \
            if "fwd_bwd_ms" in ours else [ours.get("skipped", "-")[:40], "-", "-"]
        old = f"{m['old']['fwd_bwd_ms']:.3f} (x{r['old_over_ours'] or 0:.2f})" if "fwd_bwd_ms" in m["old"] else "-"
        lines.append(f"| {r['case']} | {r['dtype']} | {r['T']} | {r['E']} | {r['rule']} | {r['causal']} | "
                     + " | ".join(cells) + f" | {old} | "
                     + (f"{best:.3f} (x{r['fla_over_ours'] or 0:.2f})" if best else "-") + " |")
    return lines


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
    # the fused read's tests only where the check had the step (older runs did not)
    for name, what in (("pytest_cuda", "tests/cuda"), ("pytest_fused", "tests/ops/test_fused_read*.py")):
        step = steps.get(name)
        if step is None and name == "pytest_fused":
            continue
        counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", step["tail"])) \
            if step else {}
        rows.append((f"pytest {what}: every case passes", ", ".join(f"{n} {k}" for k, n in counts.items()) or
                     (step["status"] if step else "not run"),
                     verdict(step["status"] == "ok" and counts.get("passed", 0) > 0 if counts else None)))
    return rows


def fairseq_table(bench):
    if bench is None:
        return []
    lengths = sorted({g["length"] for c in bench["configs"].values() for g in c.get("generate", [])})
    lines = [f"\nfairseq end to end ({bench['args']['arch']}, {bench['device']}): train words/s "
             f"({bench.get('steady_state_rule', 'median of the logged intervals after the first')}; spread over the "
             f"runs), peak MiB and generate tokens/s at beam {bench['args']['beam']}, each x softmax\n",
             "| config | train words/s | spread | train peak MiB | " + " | ".join(f"generate N={n}" for n in lengths)
             + " |", "|---|---:|---:|---:|" + "---:|" * len(lengths)]
    for name, c in bench["configs"].items():
        tr, vs = c.get("train", {}), c.get("vs_softmax", {})
        wps = f"{tr['wps_median']:.0f} (x{vs.get('train_wps') or 0:.2f})" if tr.get("wps_median") else "-"
        spread = f"{tr['spread']:.1%} of {len(tr['wps_runs'])}" if tr.get("spread") is not None else "-"
        peak = f"{tr['peak_MiB']:.0f} (x{vs.get('peak_memory') or 0:.2f})" if tr.get("peak_MiB") else "-"
        gen = {g["length"]: g for g in c.get("generate", [])}
        cells = [f"{gen[n]['tokens_per_s']:.0f} (x{vs['generate_tokens_per_s'].get(str(n)) or 0:.2f})"
                 if n in gen else "-" for n in lengths]
        lines.append(f"| {name} | {wps} | {spread} | {peak} | " + " | ".join(cells) + " |")
    lines += [f"- not run: {line.splitlines()[0]}" for line in bench.get("not_run", [])]
    return lines + profile_table(bench)


def profile_table(bench, top=5):
    """Each configuration's top operators of one profiled training update (fw_research.benchmarks.fairseq_run)."""
    profiled = {name: c["profile"] for name, c in bench["configs"].items() if c.get("profile", {}).get("ops")}
    failed = [f"- {name}: not profiled: {c['profile']['error']}" for name, c in bench["configs"].items()
              if "error" in c.get("profile", {})]
    if not profiled:
        return failed
    clock = next(iter(profiled.values()))["clock"]
    lines = [f"\none training update per configuration, its top {top} operators by {clock} (the JSON keeps 15)\n",
             "| config | update ms | operator | calls | self ms | % |", "|---|---:|---|---:|---:|---:|"]
    for name, prof in profiled.items():
        for i, op in enumerate(prof["ops"][:top]):
            head = f"| {name} | {prof['total_ms']:.1f} |" if i == 0 else "| | |"
            lines.append(f"{head} {op['name'].replace('|', '/')[:70]} | {op['calls']} | {op['self_ms']:.2f} | "
                         f"{op['percent']:.1f} |")
    return lines + failed


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
    ran_fused = any(s["name"] == "bench_fused" for s in (check or {}).get("steps", []))
    ops, fused, fairseq = (load(out / f"{name}.json") for name in ("bench_gpu", "bench_fused_read", "bench_fairseq"))
    targets = check_targets(check) + fused_targets(fused, ran_fused) + ops_targets(ops) + fairseq_targets(fairseq)
    lines += ["", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {v} | {ok} |" for t, v, ok in targets]
    lines += fused_table(fused) + ops_table(ops) + shapes_table(ops) + fairseq_table(fairseq)
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the folder gpu_check.sh wrote")
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
