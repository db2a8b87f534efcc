"""What a Table 1 row costs: the GPU-hours expected before it starts (fw_research.wmt14.table1_run --dry-run), from
measured training speed, and the wall time and GPU-hours it took (its trained.json marker).

Expected GPU-hours = epochs x target tokens per epoch / (train words/s of one GPU) / 3600, where:
- words/s is fairseq's own (target tokens a second) of transformer_fw_big --fp16 on one GPU, measured by
  fw_research.benchmarks.bench_fairseq_gpu in a committed result (benchmarks/results/gpu_<device>_<date>/, the newest
  date that measured the configuration; the device and the folder are named beside each row): the row's own
  configuration where one was measured with the row's flags (its config file's FW_ARGS and CRITERION_ARGS, as
  bench_fairseq_gpu's table1_ROW configuration runs them), else the nearest measured configuration, named as its
  stand-in (STAND_INS);
- the tokens are counted in the prepared data (the binarised German side), or, before it is prepared, ASSUMED:
  4.5 M sentence pairs of about 30 subword tokens (and an end of sentence) each;
- several GPUs on a row share its tokens at about the same speed each, so they change its wall time, not its
  GPU-hours.
"""
import json
import statistics
from pathlib import Path

import numpy as np

from fw_research.benchmarks import bench_fairseq_gpu

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "benchmarks/results"
EPOCHS = 45  # configs/wmt14_en_de/common.sh --max-epoch
ASSUMED_TOKENS = 4.5e6 * 31
# a row without a measurement of its own -> the configuration measured in its place and how the two differ (E, the
# rule or the blocks): an estimate until the row's own configuration is measured
STAND_INS = {"dpfp_nu2": ("dpfp2_sum", "stand-in: the encoder convolution"),
             "dpfp_nu4": ("dpfp2_sum", "stand-in: E 256, not 512"), "linear": ("dpfp2_sum", "stand-in: DPFP-2"),
             "performer_m32": ("dpfp2_sum", "stand-in: DPFP-2"), "performer_m128": ("dpfp2_sum", "stand-in: DPFP-2"),
             "performer_m256": ("dpfp2_sum", "stand-in: DPFP-2, E 256, not 512"),
             "dpfp_nu2_delta": ("dpfp2_delta_dec", "stand-in: the encoder convolution"),
             "dpfp_nu4_delta": ("dpfp2_delta_dec", "stand-in: E 256, the encoder convolution"),
             "dpfp_nu2_delta_softcross": ("dpfp2_delta_dec", "stand-in: fast-weight cross-attention"),
             "dpfp_nu2_delta_align4": ("dpfp2_delta_dec", "stand-in: cross-attention not aligned, no unlikelihood "
                                                          "term")}
CHECKPOINT_GB = 209e6 * 4 * 3 / 1e9  # transformer_fw_big's weights and Adam's two moments, float32
CHECKPOINTS_KEPT = 12  # --keep-last-epochs 10, checkpoint_best.pt, checkpoint_last.pt
DATA_GB = 12  # the five archives (about 1.7 GB), their text, tokenised and BPE copies, and the binarised data


def target_tokens(data):
    """Target tokens per epoch: the sizes in data/train.en-de.de.idx (fairseq's mmap index: 9-byte magic, version,
    dtype code, count, then the int32 sizes), or ASSUMED_TOKENS where the data is not prepared."""
    index = Path(data) / "train.en-de.de.idx"
    if not index.exists():
        return ASSUMED_TOKENS, "assumed: 4.5 M pairs x 31 target tokens"
    raw = index.read_bytes()
    count = int(np.frombuffer(raw, dtype="<u8", count=1, offset=18)[0])
    sizes = np.frombuffer(raw, dtype="<i4", count=count, offset=26)
    return float(sizes.sum()), f"counted in {index}"


def steady_wps(result):
    """{configuration: (flags, words/s)} of a bench_fairseq_gpu.py result: its steady-state median where it has one,
    else (results older than the steady-state rule) the median of the later half of its logged intervals."""
    rates = {}
    for name, config in result["configs"].items():
        train = config.get("train") or {}
        logged = train.get("wps_logged") or []
        rate = train.get("wps_median") or (statistics.median(logged[len(logged) // 2:]) if logged else None)
        if rate:
            rates[name] = (config.get("flags", ""), rate)
    return rates


def measurements(root=RESULTS):
    """Every committed measurement, newest first: [(folder, device, configuration, flags, words/s)], the folder's
    date (gpu_<device>_<date>) deciding."""
    found = []
    for path in Path(root).glob("gpu_*/**/bench_fairseq.json"):
        folder = path.relative_to(root).parts[0]
        result = json.loads(path.read_text())
        for name, (flags, rate) in steady_wps(result).items():
            found.append((folder, result.get("device", "unknown GPU"), name, flags, rate))
    return sorted(found, key=lambda m: (m[0].rsplit("_", 1)[-1], m[0]), reverse=True)


def row_rate(row, found):
    """(words/s, configuration, note, folder, device) of a row: the newest measurement of its own flags, else of
    its stand-in; None where neither was measured."""
    own = " ".join(bench_fairseq_gpu.config_flags(bench_fairseq_gpu.TABLE1_DIR / f"{row}.sh"))
    name, note = STAND_INS.get(row, (None, ""))
    for wanted, label in ((lambda m: m[3] == own, ""), (lambda m: m[2] == name, note)):
        match = next((m for m in found if wanted(m)), None)
        if match:
            return match[4], match[2], label, match[0], match[1]
    return None


def plan(data, rows, gpus_per_row):
    """The expected GPU-hours, wall time and disk of each row, as Markdown with its assumptions."""
    tokens, source = target_tokens(data)
    found = measurements()
    lines = [f"Expected cost ({EPOCHS} epochs of {tokens / 1e6:.0f} M target tokens, {source}; train words/s of one "
             "GPU, transformer_fw_big --fp16, the newest committed measurement under benchmarks/results/):", "",
             "| row | measured as | measured in | words/s | GPU-hours | wall hours on its GPUs | checkpoints GB |",
             "|---|---|---|---:|---:|---:|---:|"]
    total = 0.0
    for row in rows:
        rate, name, note, folder, device = row_rate(row, found) or (None, "not measured", "", "–", "")
        hours = EPOCHS * tokens / rate / 3600 if rate else None
        total += hours or 0.0
        shown = f"{name} ({note})" if note else name
        lines.append(f"| {row} | {shown} | {folder}{f' ({device})' if device else ''} | {rate or 0:,.0f} | "
                     f"{_hours(hours)} | {_hours(hours / gpus_per_row if hours else None)} | "
                     f"{CHECKPOINT_GB * CHECKPOINTS_KEPT:.0f} |")
    disk = DATA_GB + CHECKPOINT_GB * CHECKPOINTS_KEPT * len(rows)
    lines += ["", f"All rows: {total:,.0f} GPU-hours; disk about {disk:,.0f} GB ({DATA_GB} GB of data, "
              f"{CHECKPOINTS_KEPT} checkpoints of {CHECKPOINT_GB:.1f} GB a row)."]
    return "\n".join(lines) + "\n"


def spent(save_root, rows):
    """The wall time and GPU-hours each trained row took (its trained.json), as Markdown."""
    lines = ["| row | GPUs | wall hours | GPU-hours |", "|---|---:|---:|---:|"]
    for row in rows:
        marker = Path(save_root) / row / "trained.json"
        if marker.exists():
            took = json.loads(marker.read_text())
            hours = took["seconds"] / 3600
            lines.append(f"| {row} | {took['gpus']} | {hours:.2f} | {hours * max(1, took['gpus']):.2f} |")
    return "Training time (GPU-hours: wall hours x GPUs; the CPU counts as one):\n\n" + "\n".join(lines) + "\n"


def _hours(hours):
    return "–" if hours is None else f"{hours:,.1f}"
