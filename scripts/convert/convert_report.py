"""The conversion study's table and plot (convert_study.py) from its results file.

    python scripts/convert/convert_report.py results/convert_study/demo.json
"""
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server
import matplotlib.pyplot as plt  # noqa: E402

STARTS = ("scratch", "continued", "converted", "distilled")  # how a row's model began, in the table's order


def _ratio(value, reference):
    return "–" if value is None or not reference else f"{value / reference:.2f}×"


def _number(value, digits):
    return "–" if value is None else f"{value:.{digits}f}"


def table(results):
    teacher = results["teacher"]
    lines = [f"Teacher: softmax, {teacher['updates']} updates of the `{results['preset']}` preset, seed "
             f"{results['seed']}: BLEU {teacher['bleu']}, valid loss {_number(teacher['valid_loss'], 3)}, "
             f"{_number(teacher['tokens_per_second'], 0)} tokens/s decoding the test split.", "",
             "| configuration | start | total updates | valid loss | BLEU | × teacher BLEU | tokens/s | × teacher tokens/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    rows = sorted(results["runs"], key=lambda r: (r["config"], r["total"], STARTS.index(r["start"])))
    for row in rows:
        lines.append(f"| {row['config']} | {row['start']} | {row['total']} | {_number(row['valid_loss'], 3)} | "
                     f"{row['bleu']:.2f} | {_ratio(row['bleu'], teacher['bleu'])} | "
                     f"{_number(row['tokens_per_second'], 0)} | "
                     f"{_ratio(row['tokens_per_second'], teacher['tokens_per_second'])} |")
    lines += ["", "start: scratch = trained from random weights for the total; converted = the teacher's weights, "
              "fine-tuned for the total; distilled = converted, its attention distilled into the maps for a quarter "
              "of the total, then fine-tuned for the rest; continued = the teacher itself trained the total more, "
              "with the fine-tuning's schedule. "
              f"{results['machine']}, {results['cpu_count']} threads, torch {results['torch']}; "
              f"{results['wall_minutes']} minutes."]
    return "\n".join(lines) + "\n"


def plot(results, path):
    configs = sorted({r["config"] for r in results["runs"]})
    fig, axes = plt.subplots(1, len(configs), figsize=(3.2 * len(configs), 3.2), sharey=True, squeeze=False)
    for ax, config in zip(axes[0], configs):
        for start, style in zip(STARTS, ("o:", "d--", "s-", "^-")):
            rows = sorted((r for r in results["runs"] if r["config"] == config and r["start"] == start),
                          key=lambda r: r["total"])
            if rows:
                ax.plot([r["total"] for r in rows], [r["bleu"] for r in rows], style, label=start)
        ax.axhline(results["teacher"]["bleu"], color="grey", lw=1, label=f"teacher ({results['teacher']['updates']} u.)")
        ax.set_title(config, fontsize=8)
        ax.set_xlabel("total updates")
        ax.legend(fontsize=6)  # per panel: a map without parameters has no distilled line
    axes[0][0].set_ylabel("test BLEU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(stem, results):
    """{stem}.md and {stem}.png; returns the table."""
    text = table(results)
    Path(stem).with_suffix(".md").write_text(text)
    plot(results, Path(stem).with_suffix(".png"))
    return text


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: convert_report.py RESULTS.json")
    path = Path(sys.argv[1])
    print(write(path.with_suffix(""), json.loads(path.read_text())))
