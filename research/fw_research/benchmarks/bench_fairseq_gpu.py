"""fairseq end to end on a GPU: steady-state training words/s, peak memory and decoding tokens/s per configuration.

    python -m fw_research.benchmarks.bench_fairseq_gpu --out bench_fairseq.json          # transformer_fw_big, --fp16
    python -m fw_research.benchmarks.bench_fairseq_gpu --arch transformer_fw_small --updates 6 --lengths 4 ...  # smoke

Configurations (CONFIGS): softmax (--fw-attention none); dpfp2_sum (DPFP-2, the sum rule in every block, the
plain read of the source, encoder convolution 3); dpfp2_delta_dec (the same with the delta rule in the decoder's
self-attention, sum-normalised phi); dpfp2_delta_dec_align4_ul2, the translation models' defaults as a user trains
them (dpfp2_delta_dec with the aligned cross-attention, --fw-cross-align 4, and their criterion, fw_unlikelihood at
alpha 2); table1_ROW, the row configs/wmt14_en_de/ROW.sh of Table 1 with the fast-weight and criterion flags that
file passes to scripts/wmt14/train.sh (table1_dpfp_nu2, the paper's DPFP-2 row, runs by default; the others on
request, so that table1.sh --dry-run prices each row from its own measurement). On request (--configs),
NAME_unfused: a fast-weight configuration with the fused read switched off in the runner (FW_NO_FUSED_READ), so
that every block takes the path the fused read replaces; beside NAME it gives the fused read's end-to-end effect.
Every configuration gets the same data, seed, batches and training flags besides those.

On generated parallel data (10..50 tokens a sentence, a 2,000-word vocabulary, the target a fixed word mapping of
the source) through the real CLIs (fw_research.benchmarks.fairseq_run):
- training: --rounds rounds of every configuration, each round in the reverse order of the one before (A B C D,
  D C B A), so that a drift of the machine shows as a spread between a configuration's runs instead of as a
  difference between configurations. The training set is sized so that --updates span about --epochs epochs.
  Steady state (STEADY_RULE): a run's words/s is the median of fairseq's own train_inner words/s over the
  intervals logged in epochs >= 2, less each epoch's first interval (it spans the epoch boundary); the first
  epoch holds the start-up, the allocator's growth and the kernels' compilation. A configuration reports the
  median over its runs and the spread (max - min) / median. Peak memory: the CUDA allocator's high-water mark.
- profile: the first round's run of each configuration profiles its --profile-update-th update (inside the first
  epoch, so outside the steady state) and keeps the top 15 operators by self CUDA time (CPU time on a CPU); with
  --profile-window K also K updates of the first epoch and K of the second (fairseq_run.py's windows).
- generation: fairseq-generate (beam --beam) translates the test sentences forced to each output length
  (--min-len N --max-len-a 0 --max-len-b N) with the last round's checkpoint, reporting fairseq's tokens/s.
Ratios are against softmax. Results are written after every run, so a run stopped by --budget-s (or killed)
leaves what it finished.
"""
import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[3]
RUNNER = [sys.executable, "-m", "fw_research.benchmarks.fairseq_run"]
TABLE1_DIR = REPO / "configs" / "wmt14_en_de"
# Table 1's rows: a config file each, beside the recipe they share (common.sh); its Standard row is softmax
TABLE1 = {f"table1_{path.stem}": path for path in sorted(TABLE1_DIR.glob("*.sh"))
          if path.stem not in ("common", "standard")}
DPFP2 = ["--fw-feature-map", "dpfp", "--fw-dpfp-nu", "2"]
# fw_research.demo.compare_attention's rows dpfp2-sum-vconv3 (the sum rule) and dpfp2-delta-dec-vconv3 (the delta
# rule in the decoder, sum-normalised phi), both reading the source plainly, and the defaults' row below;
# tests/scripts/test_bench_fused_read.py checks that they stay the same
SHIPPED = {"softmax": ["--fw-attention", "none"],
           "dpfp2_sum": [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "sum", "--fw-encoder-conv", "3",
                         "--fw-cross-align", "0"],
           "dpfp2_delta_dec": [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta", "--fw-delta-norm",
                               "sum", "--fw-encoder-conv", "3", "--fw-cross-align", "0"],
           # the translation models' defaults with their criterion, compare_attention's
           # dpfp2-delta-dec-align4-ul2-vconv3: the delta configuration with the aligned cross-attention, which takes
           # the fused read's aligned form, trained with fw_unlikelihood as the README's first command does
           "dpfp2_delta_dec_align4_ul2": [*DPFP2, "--fw-update-rule", "sum", "--fw-decoder-rule", "delta",
                                          "--fw-delta-norm", "sum", "--fw-cross-align", "4", "--fw-encoder-conv", "3",
                                          "--criterion", "fw_unlikelihood", "--unlikelihood-alpha", "2"]}
DEFAULT_NAMES = [*SHIPPED, "table1_dpfp_nu2"]
UNFUSED = "_unfused"  # a name's suffix: the runner switches the fused read off (fairseq_run.py)
NAMES = [*SHIPPED, *TABLE1, *(name + UNFUSED for name in DEFAULT_NAMES if name != "softmax")]
MEAN_TOKENS = 31  # a generated sentence: 10..50 words (mean 30) and </s>
STEADY_RULE = ("median of fairseq's train_inner wps over the intervals logged in epochs >= 2, less each epoch's "
               "first interval (it spans the epoch boundary)")
GENERATED = re.compile(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([0-9.]+)s "
                       r"\([0-9.]+ sentences/s, ([0-9.]+) tokens/s\)")


def config_flags(config):
    """The FW_ARGS and CRITERION_ARGS a Table 1 config file gives scripts/wmt14/train.sh, read by bash as train.sh
    sources it."""
    script = ('source "$1"; FW_ARGS=(); CRITERION_ARGS=(); source "$2"; '
              'printf "%s\\0" "${FW_ARGS[@]}" "${CRITERION_ARGS[@]}"')
    out = subprocess.run(["bash", "-c", script, "config_flags", str(config.parent / "common.sh"), str(config)],
                         capture_output=True, text=True, check=True).stdout
    return out.split("\0")[:-1]


def configs():
    flags = {**SHIPPED, **{name: config_flags(path) for name, path in TABLE1.items()}}
    return {name: flags[name.removesuffix(UNFUSED)] for name in NAMES}


def runner_env(name, **extra):
    """The runner's environment for a configuration: FW_NO_FUSED_READ=1 for a NAME_unfused one."""
    unfused = {"FW_NO_FUSED_READ": "1"} if name.endswith(UNFUSED) else {}
    return dict(os.environ, **unfused, **extra) if unfused or extra else None


def fairseq(work, command, *args, env=None):
    """Run a fairseq CLI through the runner; (stdout+stderr, the runner's record). Raises with its tail."""
    record = work / f".record_{command}.json"
    proc = subprocess.run([*RUNNER, str(record), command, *map(str, args)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"fairseq-{command} failed:\n" + "\n".join(proc.stdout.splitlines()[-30:]))
    return proc.stdout, json.loads(record.read_text())


def make_data(work, train_sentences, test_sentences, workers):
    """Raw text in work/raw, binarised in work/bin (kept while the sizes asked for stay the same)."""
    stamp, want = work / "bin" / ".sizes", f"{train_sentences} {test_sentences}"
    if stamp.exists() and stamp.read_text() == want:
        return
    shutil.rmtree(work / "bin", ignore_errors=True)
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
    stamp.write_text(want)


def run_order(names, rounds):
    """[(round, name)]: every configuration once a round, each round the reverse of the one before."""
    return [(r, name) for r in range(rounds) for name in (names if r % 2 == 0 else names[::-1])]


def steady_state(records):
    """(median words/s or None, the intervals it used) of a run's json log records (STEADY_RULE)."""
    inner = [r for r in records if "wps" in r and "epoch" in r]  # train_inner; the epoch line says train_wps
    firsts = {}
    for i, r in enumerate(inner):
        firsts.setdefault(int(r["epoch"]), i)
    used = [float(r["wps"]) for i, r in enumerate(inner) if int(r["epoch"]) >= 2 and i != firsts[int(r["epoch"])]]
    return (statistics.median(used) if used else None), used


def train(work, name, flags, rnd, args, on_gpu):
    """One training run: its steady-state words/s, peak MiB, logged intervals and (first round) profile."""
    save = work / "checkpoints" / name
    shutil.rmtree(save, ignore_errors=True)  # a fresh run, not a resumed one
    profiling = {"FW_PROFILE_UPDATE": str(args.profile_update)} if rnd == 0 and args.profile_update else {}
    if rnd == 0 and args.profile_window:
        profiling["FW_PROFILE_WINDOW"] = str(args.profile_window)
    env = runner_env(name, **profiling)
    start = time.monotonic()
    out, record = fairseq(
        work, "train", work / "bin", "--user-dir", REPO / "fw_fairseq", "--arch", args.arch,
        "--share-all-embeddings", "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "5e-4",
        "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--dropout", "0.3", "--max-tokens", args.max_tokens, "--max-update", args.updates,
        "--required-batch-size-multiple", "1", "--log-format", "json", "--log-interval", args.log_interval,
        # a checkpoint only when training stops (for generation), none at the epochs' ends inside the measurement
        "--disable-validation", "--no-epoch-checkpoints", "--save-interval", "100000", "--no-save-optimizer-state",
        "--save-dir", save, "--seed", "1", *(["--fp16"] if on_gpu else ["--cpu"]),
        # last: a configuration's --criterion replaces the shared one (argparse keeps an option's last value)
        *flags, env=env)
    records = json_logs(out)
    wps, used = steady_state(records)
    summaries = [r for r in records if "train_wps" in r]  # one line per finished epoch
    run = {"round": rnd, "wps_steady": wps, "intervals_used": len(used),
           "epochs": max((int(r["epoch"]) for r in records if "epoch" in r), default=0),
           "first_epoch_updates": int(summaries[0]["train_num_updates"]) if summaries else None,
           "wps_logged": [[int(r["epoch"]), float(r["wps"])] for r in records if "wps" in r and "epoch" in r],
           "peak_MiB": record["peak_MiB"], "seconds": round(time.monotonic() - start, 1)}
    for key in ("profile", "windows"):
        if key in record:
            run[key] = record[key]
    return run


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


def summarise(res, updates):
    """A configuration's train summary over its runs: median steady words/s, spread, peak MiB, profile."""
    runs = res.get("runs", [])
    wps = [r["wps_steady"] for r in runs if r["wps_steady"]]
    peaks = [r["peak_MiB"] for r in runs if r["peak_MiB"] is not None]
    median = statistics.median(wps) if wps else None
    res["train"] = {"wps_median": median, "wps_runs": wps,
                    "spread": (max(wps) - min(wps)) / median if len(wps) > 1 else None,
                    "peak_MiB": max(peaks) if peaks else None, "updates": updates}
    for key in ("profile", "windows"):  # the first round's
        first = next((r[key] for r in runs if key in r), None)
        if first is not None:
            res[key] = first


def generate(work, name, length, args, on_gpu):
    out, record = fairseq(
        work, "generate", work / "bin", "--user-dir", REPO / "fw_fairseq", "--path",
        work / "checkpoints" / name / "checkpoint_last.pt", "--gen-subset", "test", "--beam", args.beam,
        "--batch-size", args.sentences, "--required-batch-size-multiple", "1", "--min-len", length,
        "--max-len-a", "0", "--max-len-b", length, "--quiet", *(["--fp16"] if on_gpu else ["--cpu"]),
        env=runner_env(name))
    match = GENERATED.search(out)
    if match is None:
        raise RuntimeError("fairseq-generate printed no summary:\n" + "\n".join(out.splitlines()[-20:]))
    return {"length": length, "tokens": int(match.group(2).replace(",", "")), "seconds": float(match.group(3)),
            "tokens_per_s": float(match.group(4)), "peak_MiB": record["peak_MiB"]}


def ratios(results):
    """Each configuration's train words/s, peak memory and generate tokens/s over softmax's."""
    base = results["configs"].get("softmax", {})

    def over(res, key):
        mine, ref = res.get("train", {}).get(key), base.get("train", {}).get(key)
        return mine / ref if mine and ref else None

    for res in results["configs"].values():
        summarise(res, results["updates"])
    for res in results["configs"].values():
        gen = {}
        for g in res.get("generate", []):
            ref = next((b for b in base.get("generate", []) if b["length"] == g["length"]), None)
            gen[str(g["length"])] = g["tokens_per_s"] / ref["tokens_per_s"] if ref else None
        res["vs_softmax"] = {"train_wps": over(res, "wps_median"), "peak_memory": over(res, "peak_MiB"),
                             "generate_tokens_per_s": gen}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/fw_bench_fairseq"))
    parser.add_argument("--arch", default="transformer_fw_big")
    parser.add_argument("--configs", nargs="+", choices=NAMES, default=DEFAULT_NAMES)
    parser.add_argument("--updates", type=int, default=240, help="updates per training run")
    parser.add_argument("--epochs", type=int, default=3, help="the training set is sized for about this many "
                        "epochs in --updates (the steady state is read from epochs >= 2)")
    parser.add_argument("--rounds", type=int, default=2, help="training runs per configuration, interleaved")
    parser.add_argument("--profile-update", type=int, default=10, help="profile this update of each configuration's "
                        "first run (0: none); keep it inside the first epoch")
    parser.add_argument("--profile-window", type=int, default=0, help="profile this many updates of epochs 1 and 2 "
                        "in each configuration's first run (fairseq_run.py's windows; 0: none); it slows them")
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--log-interval", type=int, default=10)
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 128, 512])
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=32, help="test sentences, one batch")
    parser.add_argument("--train-sentences", type=int, help="default: enough for --updates / --epochs updates an "
                        "epoch at --max-tokens")
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no run after this many seconds")
    args = parser.parse_args(argv)
    if args.profile_window and 2 <= args.profile_update <= 1 + args.profile_window:  # one profiler at a time
        parser.error(f"argument --profile-update: {args.profile_update} falls in the first epoch's window (updates 2.."
                     f"{1 + args.profile_window} of --profile-window {args.profile_window}); allowed: 0, 1 or "
                     f"> {1 + args.profile_window}")
    if args.train_sentences is None:  # a batch of --max-tokens holds about max_tokens / MEAN_TOKENS sentences
        args.train_sentences = max(1, round(args.updates / args.epochs * args.max_tokens / MEAN_TOKENS))
    return args


def main(argv=None):
    args = parse_args(argv)
    deadline = time.monotonic() + args.budget_s
    on_gpu = torch.cuda.is_available()
    args.work.mkdir(parents=True, exist_ok=True)
    flags = {name: f for name, f in configs().items() if name in args.configs}
    results = {"device": torch.cuda.get_device_name() if on_gpu else "cpu", "torch": torch.__version__,
               "cuda": torch.version.cuda, "args": {k: str(v) for k, v in vars(args).items()},
               "steady_state_rule": STEADY_RULE, "updates": args.updates,
               "configs": {name: {"flags": " ".join(f), "runs": []} for name, f in flags.items()}, "not_run": []}

    def save():
        ratios(results)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")

    make_data(args.work, args.train_sentences, args.sentences, min(8, os.cpu_count() or 1))
    runs = [("train", name, rnd) for rnd, name in run_order(list(flags), args.rounds)]
    runs += [("generate", name, length) for length in args.lengths for name in flags]
    for kind, name, arg in runs:
        label = f"{kind} {name}" + (f" round {arg + 1}" if kind == "train" else f" N={arg}")
        if time.monotonic() > deadline:
            results["not_run"].append(f"{label}: out of budget")
            continue
        try:
            if kind == "train":
                results["configs"][name]["runs"].append(train(args.work, name, flags[name], arg, args, on_gpu))
            else:
                results["configs"][name].setdefault("generate", []).append(generate(args.work, name, arg, args, on_gpu))
        except RuntimeError as err:
            results["not_run"].append(f"{label}: {err}")
        print(f"bench_fairseq: {label} done", flush=True)
        save()
    save()
    report(results, args)


def report(results, args):
    print(f"\n{args.arch} on {results['device']}: steady-state train words/s (x softmax, spread over "
          f"{args.rounds} runs), peak MiB (x softmax), generate tokens/s at beam {args.beam}")
    for name, res in results["configs"].items():
        tr, ratio = res["train"], res["vs_softmax"]
        gen = ratio["generate_tokens_per_s"]
        cells = [f"{g['length']}: {g['tokens_per_s']:.0f} (x{gen.get(str(g['length'])) or 0:.2f})"
                 for g in res.get("generate", [])]
        print(f"{name:<16} train {tr['wps_median'] or 0:9.0f} (x{ratio['train_wps'] or 0:.2f}, spread "
              f"{tr['spread'] or 0:.1%}) peak {tr['peak_MiB'] or 0:7.0f} (x{ratio['peak_memory'] or 0:.2f}) | "
              "generate " + "  ".join(cells))
    for line in results["not_run"]:
        print(f"not run: {line.splitlines()[0]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
