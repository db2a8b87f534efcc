"""The table (Markdown) and the valid-loss curves (PNG) of a compare_attention result file.

Each configuration's numbers are means over its seeds; ratios are taken against the softmax row of the
same file (same preset, updates and seeds). Used by scripts/compare_attention.py, also with --report-only.
"""
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402


def _mean(values):
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def _ratio(value, reference):
    return f"{value / reference:.2f}×" if reference else "–"


def summarise(results):
    """config -> {kind, bleu, bleu_sd, valid_loss, seconds_per_update, curve, seeds}, in the file's order."""
    rows = {}
    for name, config in results["configs"].items():
        runs = [r for r in results["runs"] if r["config"] == name]
        if not runs:
            continue
        bleus = [r["bleu"] for r in runs]
        steps = sorted({u for r in runs for u, _ in r["curve"]})
        curve = [(u, _mean([dict(r["curve"]).get(u) for r in runs])) for u in steps]
        rows[name] = {"kind": config["kind"], "flags": config["flags"], "seeds": len(runs),
                      "bleu": statistics.fmean(bleus), "bleu_sd": statistics.pstdev(bleus),
                      "valid_loss": curve[-1][1] if curve else None,
                      "seconds_per_update": _mean([r["seconds_per_update"] for r in runs]), "curve": curve}
    return rows


def table(results):
    rows = summarise(results)
    ref = rows["softmax"]
    lines = [f"{results['preset']} preset, {results['updates']} updates, seeds {results['seeds']}, "
             f"{results['cpu_count']} threads, torch {results['torch']}",
             "", "| configuration | kind | BLEU | × softmax | valid loss | s / update | × softmax time |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for name, row in rows.items():
        spread = f" ± {row['bleu_sd']:.2f}" if row["seeds"] > 1 else ""
        time_ratio = _ratio(row["seconds_per_update"] or 0, ref["seconds_per_update"])
        seconds = f"{row['seconds_per_update']:.3f}" if row["seconds_per_update"] else "–"
        loss = f"{row['valid_loss']:.3f}" if row["valid_loss"] is not None else "–"
        lines.append(f"| {name} | {row['kind']} | {row['bleu']:.2f}{spread} | {_ratio(row['bleu'], ref['bleu'])} | "
                     f"{loss} | {seconds} | {time_ratio} |")
    fast = {name: row for name, row in rows.items() if row["kind"] == "fast"}
    if fast:
        worst, best = min(fast, key=lambda n: fast[n]["bleu"]), max(fast, key=lambda n: fast[n]["bleu"])
        lines += ["", f"Fast-weight rows: best {best} {_ratio(fast[best]['bleu'], ref['bleu'])} softmax BLEU, "
                      f"worst {worst} {_ratio(fast[worst]['bleu'], ref['bleu'])}."]
    lines.append(f"\nSeconds per update are wall time of training updates in this run ({results['jobs']} "
                 "at once): rows trained at different times on a shared machine do not compare.")
    lines.append("\nFlags of each configuration (beyond the preset's model and optimiser):\n")
    lines += [f"- `{name}`: `{' '.join(row['flags'])}`" for name, row in rows.items()]
    return "\n".join(lines) + "\n"


def plot(results, path):
    rows = summarise(results)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, row in rows.items():
        style = {"softmax": "-k", "hybrid": ":"}.get(row["kind"], "-")
        ax.plot([u for u, _ in row["curve"]], [loss for _, loss in row["curve"]], style, label=name, marker=".")
    ax.set_xlabel("updates")
    ax.set_ylabel("valid loss (label-smoothed CE, base 2)")
    ax.set_title(f"En→De catalogs, {results['preset']} preset, mean of seeds {results['seeds']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(stem, results):
    """stem.md and stem.png from `results`; returns the table."""
    text = table(results)
    Path(stem).with_suffix(".md").write_text(text)
    plot(results, Path(stem).with_suffix(".png"))
    return text
