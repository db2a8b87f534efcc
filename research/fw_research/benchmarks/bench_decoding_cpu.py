"""fairseq-generate speed and memory: fast-weight decoders vs softmax, as the output grows.

Trains (one update, through the real fairseq-train) `transformer_fw` models of the same size with
ELU sum, DPFP-1 sum and DPFP-2 delta attention and with `--fw-attention none` (softmax), then
times the real fairseq-generate forcing every output to N tokens (--min-len N --max-len-a 0
--max-len-b N), at beam 1 and 4, all in one run so that the ratios to softmax compare like with like.
Softmax decoding caches all past keys/values and attends over them, so its per-token cost grows
with N; the fast-weight decoder keeps a lazy cache of t (E + M) values per head while that is
smaller than its [E, M] state, then the state (fw_fairseq/decoding/decoder_state.py); its
cross-attention keeps each sentence's 13-token source as S (E + M) values per head (the keys'
features and effective writes), below the [E, M] memory for all three (source_memory.py).

Beside each time: the bytes a token must move (decoding_cost.py: parameters, attention caches,
states) and the result as a fraction of that floor at the machine's measured copy bandwidth.
Peak memory is the generate process's maximum resident set size (os.wait4), which includes
the Python/fairseq baseline that all models share.

Cells of up to 128 tokens translate --batches batches of --sentences sentences per run and run --repeats
times, the models taking turns (a change in the machine's load falls on all of them), and keep each model's
fastest; longer ones translate one batch, once.

    python -m fw_research.benchmarks.bench_decoding_cpu [--lengths 16 64 1024] [--beams 1 4] [--repeats 3] \
        [--batches 4] [--models defaults softmax] [--model-args "--encoder-layers 2 ..."] [--note TEXT]
    python -m fw_research.benchmarks.bench_decoding_cpu --render benchmarks/results/decoding_cpu.json  # its .md, no run
"""
import argparse
import json
import os
import platform
import random
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from fw_research.benchmarks.decoding_cost import bytes_per_token, copy_bandwidth, markdown, shapes

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[3]
# the sum rule in every block, the decoder's self-attention named too: transformer_fw's default rule there is delta
SUM = ["--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]
MODELS = {"elu sum": ["--fw-feature-map", "elu", *SUM],
          "dpfp-1 sum": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "1", *SUM],
          "dpfp-2 delta": ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2", "--fw-update-rule", "delta"],
          # the translation defaults: DPFP-2, the sum rule with the aligned read of the source, the delta rule in
          # the decoder's self-attention, the encoder's convolution
          "defaults": [],
          "softmax": ["--fw-attention", "none"]}
SOURCE_LENGTH = 13  # make_data's 12 words and the end-of-sentence token


THREADS = {}  # the environment's thread settings for every CLI run, set by main (--threads)


def run(args, **kwargs):
    """Run a CLI; return (output, peak RSS in MiB) of that process alone."""
    proc = subprocess.Popen([str(a) for a in args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, **THREADS}, **kwargs)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{args[0]} failed:\n{out[-3000:]}")
    return out, usage.ru_maxrss / 1024  # Linux reports KiB


def make_data(root: Path, sentences: int, batches: int):
    """Test splits of `sentences` (test: one batch) and of `batches` batches of them (test1)."""
    rng = random.Random(0)
    words = [f"w{i}" for i in range(200)]
    for split, n in [("train", 64), ("valid", 8), ("test", sentences), ("test1", sentences * batches)]:
        lines = [" ".join(rng.choices(words, k=12)) for _ in range(n)]
        for lang in ("en", "de"):
            (root / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines))
    run([BIN / "fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
         "--trainpref", root / "train", "--validpref", root / "valid",
         "--testpref", f"{root / 'test'},{root / 'test1'}",
         "--destdir", root / "bin", "--joined-dictionary", "--workers", "1"])


def train(root: Path, name: str, arch: str, fw, model_args=()):
    save = root / re.sub(r"\W+", "_", name)
    run([BIN / "fairseq-train", root / "bin", "--user-dir", REPO / "fw_fairseq", "--arch", arch, *model_args,
         *fw, "--max-target-positions", "1100", "--optimizer", "adam", "--lr", "1e-4", "--max-tokens", "2048", "--max-update", "1",
         "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation", "--seed", "1"])
    return save / "checkpoint_last.pt"


def generate(root: Path, checkpoint: Path, length: int, beam: int, batch: int, subset: str):
    out, peak_mib = run([BIN / "fairseq-generate", root / "bin", "--user-dir", REPO / "fw_fairseq",
                         "--path", checkpoint, "--gen-subset", subset, "--beam", beam,
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


def cell(root, checkpoints, model_shapes, beam, length, args, bandwidth):
    """One (beam, length) cell: every model's fastest run of --repeats (one run past 128 tokens), its floor of
    bytes per token and the ratio to softmax."""
    row = {"beam": beam, "length": length}
    runs = {name: [] for name in checkpoints}
    short = length <= 128
    for _ in range(args.repeats if short else 1):
        for name, checkpoint in checkpoints.items():  # taking turns: a change of load hits all
            runs[name].append(generate(root, checkpoint, length, beam, args.sentences, "test1" if short else "test"))
    for name in checkpoints:
        r = min(runs[name], key=lambda run: run["seconds"])
        floor = bytes_per_token(model_shapes[name], length, args.sentences, beam, SOURCE_LENGTH)
        r["floor_mb_per_token"] = floor / 1e6
        r["fraction_of_floor"] = r["tokens_per_s"] * floor / bandwidth
        row[name] = r
    sm = row["softmax"]["tokens_per_s"]
    for name in checkpoints:
        row[name]["vs_softmax"] = row[name]["tokens_per_s"] / sm
        print(f"  beam {beam} N={length:5d} {name:13s} {row[name]['tokens_per_s']:8.1f} tok/s "
              f"{row[name]['vs_softmax']:5.2f}x softmax  floor {row[name]['floor_mb_per_token']:6.1f} "
              f"MB/token, {row[name]['fraction_of_floor']:.2f} of it  peak "
              f"{row[name]['peak_rss_mib']:6.0f} MiB", flush=True)
    return row


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256, 1024])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--arch", default="transformer_fw")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), metavar="NAME",
                        help=f"the models to time, softmax always among them (default: all of {', '.join(MODELS)})")
    parser.add_argument("--model-args", default="", help="more fairseq-train flags for every model (e.g. its dims)")
    parser.add_argument("--sentences", type=int, default=4, help="sentences per batch")
    parser.add_argument("--batches", type=int, default=4,
                        help="batches each run of a cell of up to 128 tokens translates (longer cells: one): "
                             "one batch of those lasts 0.1-4 s, and with one the ratios of a cell moved by "
                             "up to 0.1 between runs")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of every fairseq run (OMP_NUM_THREADS). 1 by default: on a "
                             "CPU shared with other jobs, 2 spinning OpenMP threads ran fairseq-generate "
                             "12x slower (3.9 vs 48.9 tokens/s, DPFP-2 delta, beam 4, N = 64)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of each cell of up to 128 tokens, the fastest kept: one run of those takes "
                             "0.4-5 s, and single runs of them varied by up to 1.3x on a quiet machine")
    parser.add_argument("--note", default="", help="recorded with the results (e.g. the machine was shared)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/decoding_cpu.json")
    parser.add_argument("--render", type=Path, metavar="JSON", help="write the .md of a results file, run nothing")
    args = parser.parse_args()
    if args.render:
        if not args.render.is_file():
            parser.error(f"argument --render: {args.render} is not a file")
        saved = json.loads(args.render.read_text())
        args.render.with_suffix(".md").write_text(markdown(saved, saved["results"], list(saved["models"])))
        print(f"wrote {args.render.with_suffix('.md')}")
        return
    THREADS.update(OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    torch.set_num_threads(args.threads)  # the copy bandwidth below, like the runs

    bandwidth = copy_bandwidth()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_data(root, args.sentences, args.batches)
        models = {name: fw for name, fw in MODELS.items() if name in args.models or name == "softmax"}
        checkpoints = {name: train(root, name, args.arch, fw, shlex.split(args.model_args))
                       for name, fw in models.items()}
        model_shapes = {name: shapes(checkpoint) for name, checkpoint in checkpoints.items()}
        for beam in args.beams:
            for length in args.lengths:
                results.append(cell(root, checkpoints, model_shapes, beam, length, args, bandwidth))

    meta = {"benchmark": "fairseq-generate decoding", "arch": args.arch, "model_args": args.model_args,
            "sentences": args.sentences,
            "batches_up_to_128_tokens": args.batches,
            "source_length": SOURCE_LENGTH, "models": models, "machine": platform.processor() or "cpu",
            "machine_note": args.note, "repeats_up_to_128_tokens": args.repeats, "cpu_count": os.cpu_count(),
            "threads": args.threads, "torch": torch.__version__,
            "copy_bandwidth_gb_s": bandwidth / 1e9, "shapes": model_shapes}
    table = markdown(meta, results, list(models))
    print("\n" + table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**meta, "results": results}, indent=2))
    args.out.with_suffix(".md").write_text(table)
    print(f"wrote {args.out} and {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
