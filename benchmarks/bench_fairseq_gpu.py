"""fairseq end to end on a GPU: training words/s and decoding tokens/s, softmax vs DPFP-2 sum vs DPFP-2 delta.

    python3 benchmarks/bench_fairseq_gpu.py --out bench_fairseq.json          # transformer_fw_big, --fp16
    python3 benchmarks/bench_fairseq_gpu.py --arch transformer_fw_small --updates 2 --lengths 4 ...  # smoke

On generated parallel data (WMT-like lengths: 10..50 tokens a sentence, a 2,000-word vocabulary, the
target a fixed word mapping of the source), through the real CLIs (benchmarks/fairseq_run.py): each
configuration trains --updates updates (same data, seed and batches), reporting fairseq's own words/s
(the median of its logged intervals after the first, which holds the start-up) and the peak CUDA memory;
then fairseq-generate (beam 4) translates the test sentences forced to each output length (--min-len N
--max-len-a 0 --max-len-b N), reporting fairseq's tokens/s. Ratios are against softmax. Results are
written after every run, so a run stopped by --budget-s (or killed) leaves what it finished.
"""
import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
RUNNER = REPO / "benchmarks" / "fairseq_run.py"
CONFIGS = {"softmax": ["--fw-attention", "none"],
           "dpfp2_sum": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-update-rule", "sum"],
           "dpfp2_delta": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-update-rule", "delta"]}
GENERATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s "
                       r"\([0-9.]+ sentences/s, ([0-9.]+) tokens/s\)")


def fairseq(work, command, *args):
    """Run a fairseq CLI through the runner; (stdout+stderr, peak MiB or None). Raises with its tail."""
    peak = work / f".peak_{command}.json"
    proc = subprocess.run([sys.executable, str(RUNNER), str(peak), command, *map(str, args)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-{command} failed:\n" + "\n".join(proc.stdout.splitlines()[-30:]))
    return proc.stdout, json.loads(peak.read_text())["peak_MiB"]


def make_data(work, train_sentences, test_sentences, workers):
    """Raw text in work/raw, binarised in work/bin (skipped if already there)."""
    if (work / "bin" / "test.en-de.de.bin").exists():
        return
    rng = random.Random(0)
    vocab = 2000
    mapping = list(range(vocab))
    rng.shuffle(mapping)
    raw = work / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for split, n in [("train", train_sentences), ("valid", 100), ("test", test_sentences)]:
        src = [[rng.randrange(vocab) for _ in range(rng.randint(10, 50))] for _ in range(n)]
        (raw / f"{split}.en").write_text("".join(" ".join(f"w{t}" for t in s) + "\n" for s in src))
        (raw / f"{split}.de").write_text("".join(" ".join(f"v{mapping[t]}" for t in s) + "\n" for s in src))
    fairseq(work, "preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref", raw / "train",
            "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", work / "bin",
            "--joined-dictionary", "--workers", workers)


def train(work, name, args, on_gpu):
    save = work / "checkpoints" / name
    start = time.monotonic()
    out, peak = fairseq(
        work, "train", work / "bin", "--user-dir", REPO / "fw_fairseq", "--arch", args.arch, *CONFIGS[name],
        "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--dropout", "0.3", "--max-tokens", args.max_tokens, "--max-update", args.updates,
        "--required-batch-size-multiple", "1", "--log-format", "json", "--log-interval", args.log_interval,
        "--disable-validation", "--no-epoch-checkpoints", "--no-save-optimizer-state", "--save-dir", save,
        "--seed", "1", *(["--fp16"] if on_gpu else ["--cpu"]))
    wps = [float(rec["wps"]) for rec in json_logs(out) if "wps" in rec]  # train_inner; the epoch line says train_wps
    return {"updates": args.updates, "wps_median": statistics.median(wps[1:] or wps) if wps else None,
            "wps_logged": wps, "peak_MiB": peak, "seconds": round(time.monotonic() - start, 1)}


def json_logs(output):
    """fairseq's --log-format json records (train_inner lines and the epoch summary) in its output."""
    records = []
    for line in output.splitlines():
        brace = line.find("{")
        if brace >= 0:
            try:
                records.append(json.loads(line[brace:]))
            except json.JSONDecodeError:
                continue
    return records


def generate(work, name, length, args, on_gpu):
    out, peak = fairseq(
        work, "generate", work / "bin", "--user-dir", REPO / "fw_fairseq", "--path",
        work / "checkpoints" / name / "checkpoint_last.pt", "--gen-subset", "test", "--beam", args.beam,
        "--batch-size", args.sentences, "--required-batch-size-multiple", "1", "--min-len", length,
        "--max-len-a", "0", "--max-len-b", length, "--quiet", *(["--fp16"] if on_gpu else ["--cpu"]))
    match = GENERATED.search(out)
    if match is None:
        raise RuntimeError("fairseq-generate printed no summary:\n" + "\n".join(out.splitlines()[-20:]))
    return {"length": length, "tokens": int(match.group(2).replace(",", "")), "seconds": float(match.group(3)),
            "tokens_per_s": float(match.group(4)), "peak_MiB": peak}


def ratios(results):
    """Each configuration's train words/s and generate tokens/s over softmax's (> 1: faster)."""
    base = results["configs"].get("softmax", {})
    for name, res in results["configs"].items():
        train_ratio = None
        if res.get("train", {}).get("wps_median") and base.get("train", {}).get("wps_median"):
            train_ratio = res["train"]["wps_median"] / base["train"]["wps_median"]
        gen = {}
        for g in res.get("generate", []):
            ref = next((b for b in base.get("generate", []) if b["length"] == g["length"]), None)
            gen[str(g["length"])] = g["tokens_per_s"] / ref["tokens_per_s"] if ref else None
        res["vs_softmax"] = {"train_wps": train_ratio, "generate_tokens_per_s": gen}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/fw_bench_fairseq"))
    parser.add_argument("--arch", default="transformer_fw_big")
    parser.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--updates", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--log-interval", type=int, default=25)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=32, help="test sentences, one batch")
    parser.add_argument("--train-sentences", type=int, default=20000)
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no run after this many seconds")
    args = parser.parse_args()
    deadline = time.monotonic() + args.budget_s
    on_gpu = torch.cuda.is_available()
    args.work.mkdir(parents=True, exist_ok=True)
    results = {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
               "cuda": torch.version.cuda, "args": {k: str(v) for k, v in vars(args).items()},
               "configs": {name: {"flags": " ".join(CONFIGS[name])} for name in args.configs}, "not_run": []}

    def save():
        ratios(results)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")

    make_data(args.work, args.train_sentences, args.sentences, min(8, os.cpu_count() or 1))
    runs = [("train", name, None) for name in args.configs]
    runs += [("generate", name, length) for length in args.lengths for name in args.configs]
    for kind, name, length in runs:
        label = f"{kind} {name}" + (f" N={length}" if length else "")
        if time.monotonic() > deadline:
            results["not_run"].append(f"{label}: out of budget")
            continue
        try:
            if kind == "train":
                results["configs"][name]["train"] = train(args.work, name, args, on_gpu)
            else:
                results["configs"][name].setdefault("generate", []).append(generate(args.work, name, length, args, on_gpu))
        except RuntimeError as err:
            results["not_run"].append(f"{label}: {err}")
        print(f"bench_fairseq: {label} done", flush=True)
        save()
    save()
    print(f"\n{args.arch} on {results['device']}: train words/s (x softmax), generate tokens/s at beam {args.beam}")
    for name, res in results["configs"].items():
        tr, ratio = res.get("train", {}), res["vs_softmax"]
        cells = [f"{g['length']}: {g['tokens_per_s']:.0f} (x{ratio['generate_tokens_per_s'].get(str(g['length'])) or 0:.2f})"
                 for g in res.get("generate", [])]
        print(f"{name:<12} train {tr.get('wps_median') or 0:9.0f} (x{ratio['train_wps'] or 0:.2f}) "
              f"peak {tr.get('peak_MiB') or 0:7.0f} MiB | generate " + "  ".join(cells))
    for line in results["not_run"]:
        print(f"not run: {line.splitlines()[0]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
