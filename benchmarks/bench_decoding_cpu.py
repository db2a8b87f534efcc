"""fairseq-generate speed and memory: fast-weight decoder vs softmax, as the output grows.

Trains (one update, through the real fairseq-train) a `transformer_fw` model with delta-rule
DPFP attention and the same model with `--fw-attention none` (softmax), then times the real
fairseq-generate forcing every output to N tokens (--min-len N --max-len-a 0 --max-len-b N).
Softmax decoding caches all past keys/values and attends over them, so its per-token cost and
memory grow with N; the fast-weight decoder carries a fixed-size (W, z) per layer.

Peak memory is the generate process's maximum resident set size (os.wait4), which includes
the Python/fairseq baseline that both models share.

    python benchmarks/bench_decoding_cpu.py [--lengths 64 256 1024] [--arch transformer_fw]
"""
import argparse
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
MODELS = {"fast weights (dpfp, delta)": ["--fw-feature-map", "dpfp", "--fw-update-rule", "delta"],
          "softmax": ["--fw-attention", "none"]}


def run(args, **kwargs):
    """Run a CLI; return (output, peak RSS in MiB) of that process alone."""
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **kwargs)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{args[0]} failed:\n{out[-3000:]}")
    return out, usage.ru_maxrss / 1024  # Linux reports KiB


def make_data(root: Path, sentences: int):
    rng = random.Random(0)
    words = [f"w{i}" for i in range(200)]
    for split, n in [("train", 64), ("valid", 8), ("test", sentences)]:
        lines = [" ".join(rng.choices(words, k=12)) for _ in range(n)]
        for lang in ("en", "de"):
            (root / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines))
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--trainpref", root / "train", "--validpref", root / "valid", "--testpref", root / "test",
         "--destdir", root / "bin", "--joined-dictionary", "--workers", "1"])


def train(root: Path, name: str, arch: str, fw):
    save = root / re.sub(r"\W+", "_", name)
    run([BIN / "fairseq-train", root / "bin", "--user-dir", REPO / "fw_fairseq", "--arch", arch,
         *fw, "--max-target-positions", "1100", "--optimizer", "adam", "--lr", "1e-4", "--max-tokens", "2048", "--max-update", "1",
         "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation", "--seed", "1"])
    return save / "checkpoint_last.pt"


def generate(root: Path, checkpoint: Path, length: int, beam: int, batch: int):
    out, peak_mib = run([BIN / "fairseq-generate", root / "bin", "--user-dir", REPO / "fw_fairseq",
                         "--path", checkpoint, "--gen-subset", "test", "--beam", beam,
                         "--batch-size", batch, "--required-batch-size-multiple", "1",
                         "--min-len", length, "--max-len-a", "0", "--max-len-b", length,
                         "--quiet"])
    # "Translated 4 sentences (1,024 tokens) in 12.3s (0.33 sentences/s, 83.25 tokens/s)"
    match = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s "
                      r"\([0-9.]+ sentences/s, ([0-9.]+) tokens/s\)", out)
    if match is None:
        raise RuntimeError(f"fairseq-generate printed no summary:\n{out[-3000:]}")
    tokens, seconds = int(match.group(2).replace(",", "")), float(match.group(3))
    return {"tokens": tokens, "seconds": seconds, "tokens_per_s": float(match.group(4)),
            "peak_rss_mib": peak_mib}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--arch", default="transformer_fw")
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/decoding_cpu.json")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_data(root, args.sentences)
        checkpoints = {name: train(root, name, args.arch, fw) for name, fw in MODELS.items()}
        for length in args.lengths:
            row = {"length": length}
            for name, checkpoint in checkpoints.items():
                row[name] = generate(root, checkpoint, length, args.beam, args.sentences)
                print(f"  N={length:5d} {name:28s} {row[name]['tokens_per_s']:8.1f} tok/s "
                      f"peak {row[name]['peak_rss_mib']:7.0f} MiB", flush=True)
            results.append(row)

    fw_name, sm_name = list(MODELS)
    print(f"\nfairseq-generate, {args.arch}, beam {args.beam}, {args.sentences} sentences, "
          f"CPU x{os.cpu_count()}, torch {torch.__version__}")
    print(f"| output N | fw tok/s | softmax tok/s | fw/softmax speed | fw peak MiB | "
          f"softmax peak MiB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for row in results:
        fw, sm = row[fw_name], row[sm_name]
        print(f"| {row['length']} | {fw['tokens_per_s']:.1f} | {sm['tokens_per_s']:.1f} | "
              f"{fw['tokens_per_s'] / sm['tokens_per_s']:.2f}x | {fw['peak_rss_mib']:.0f} | "
              f"{sm['peak_rss_mib']:.0f} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "benchmark": "fairseq-generate decoding", "arch": args.arch, "beam": args.beam,
        "sentences": args.sentences, "models": MODELS, "machine": platform.processor() or "cpu",
        "cpu_count": os.cpu_count(), "torch": torch.__version__, "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
