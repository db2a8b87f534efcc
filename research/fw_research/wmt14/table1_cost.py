"""What a Table 1 row costs: the GPU-hours expected before it starts (fw_research.wmt14.table1_run --dry-run), from
measured training speed, and the wall time and GPU-hours it took (its trained.json marker).

Expected GPU-hours = epochs x target tokens per epoch / (train words/s of one GPU) / 3600, where:
- words/s is fairseq's own (target tokens a second) of transformer_fw_big --fp16 on one GPU, measured by
  fw_research.benchmarks.bench_fairseq_gpu in MEASURED (the device is named beside each row), the median of the later
  half of its logged intervals (past the first epoch's start-up); rows without a measurement of their own take the
  nearest measured configuration's, named as their stand-in;
- the tokens are counted in the prepared data (the binarised German side), or, before it is prepared, ASSUMED:
  4.5 M sentence pairs of about 30 subword tokens (and an end of sentence) each;
- several GPUs on a row share its tokens at about the same speed each, so they change its wall time, not its
  GPU-hours.
"""
import json
import statistics
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[3]
MEASURED = REPO / "benchmarks/results/gpu_h200_2026-11-26/fairseq/bench_fairseq.json"
EPOCHS = 45  # configs/wmt14_en_de/common.sh --max-epoch
ASSUMED_TOKENS = 4.5e6 * 31
# each row's configuration in MEASURED and how it differs: the same model, or a stand-in (E, the rule or the blocks
# differ: an estimate until a row of its own is measured)
MEASURED_AS = {"standard": ("softmax", ""), "dpfp_nu2": ("dpfp2_sum", "with the encoder convolution"),
               "dpfp_nu4": ("dpfp2_sum", "stand-in: E 256, not 512"), "linear": ("dpfp2_sum", "stand-in: DPFP-2"),
               "performer_m32": ("dpfp2_sum", "stand-in: DPFP-2"), "performer_m128": ("dpfp2_sum", "stand-in: DPFP-2"),
               "performer_m256": ("dpfp2_sum", "stand-in: DPFP-2, E 256, not 512"),
               "dpfp_nu2_delta": ("dpfp2_delta", "stand-in: L2 delta rule in every block, not the decoder's only"),
               "dpfp_nu4_delta": ("dpfp2_delta", "stand-in: E 256, L2 delta rule in every block"),
               "dpfp_nu2_delta_softcross": ("dpfp2_delta", "stand-in: L2 delta rule in every block, fast-weight "
                                                           "cross-attention"),
               "dpfp_nu2_delta_align4": ("dpfp2_delta", "stand-in: L2 delta rule in every block, cross-attention "
                                                        "not aligned, no unlikelihood term")}
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


def steady_wps(measured=MEASURED):
    """{configuration: words/s} and the device, from a bench_fairseq_gpu.py result."""
    run = json.loads(Path(measured).read_text())
    rates = {}
    for name, result in run["configs"].items():
        logged = (result.get("train") or {}).get("wps_logged") or []
        if logged:
            rates[name] = statistics.median(logged[len(logged) // 2:])
    return rates, run.get("device", "unknown GPU")


def plan(data, rows, gpus_per_row):
    """The expected GPU-hours, wall time and disk of each row, as Markdown with its assumptions."""
    tokens, source = target_tokens(data)
    rates, device = steady_wps()
    lines = [f"Expected cost ({EPOCHS} epochs of {tokens / 1e6:.0f} M target tokens, {source}; train words/s of one "
             f"{device}, transformer_fw_big --fp16, {MEASURED.relative_to(REPO)}):", "",
             "| row | measured as | words/s | GPU-hours | wall hours on its GPUs | checkpoints GB |",
             "|---|---|---:|---:|---:|---:|"]
    total = 0.0
    for row in rows:
        name, note = MEASURED_AS.get(row, (None, ""))
        rate = rates.get(name)
        hours = EPOCHS * tokens / rate / 3600 if rate else None
        total += hours or 0.0
        shown = f"{name} ({note})" if note else (name or "not measured")
        lines.append(f"| {row} | {shown} | {rate or 0:,.0f} | {_hours(hours)} | "
                     f"{_hours(hours / gpus_per_row if hours else None)} | {CHECKPOINT_GB * CHECKPOINTS_KEPT:.0f} |")
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
