"""The conversion study's table and plot (convert_study.py) from its results file.

    python -m fw_research.convert.convert_report results/convert_study/demo.json
"""
import json
import sys
from pathlib import Path

from fw_research.experiments.reports import mean as _mean, plt

STARTS = ("scratch", "continued", "converted", "distilled")  # how a row's model began, in the table's order


def _number(value, digits):
    return "–" if value is None else f"{value:.{digits}f}"


def _ratio(value):
    return "–" if value is None else f"{value:.2f}×"


def groups(results):
    """(config, start, total) -> its runs, one per seed, in the table's order."""
    rows = {}
    for run in results["runs"]:
        rows.setdefault((run["config"], run["start"], run["total"]), []).append(run)
    return dict(sorted(rows.items(), key=lambda item: (item[0][0], item[0][2], STARTS.index(item[0][1]))))


def row(runs, teachers):
    """One table row: means over the seeds; a ratio to the teacher is taken per seed (against that seed's own
    teacher), then averaged."""
    def per_teacher(key):
        return _mean([r[key] / teachers[r["seed"]][key] if r[key] and teachers[r["seed"]][key] else None
                      for r in runs])
    bleu = [r["bleu"] for r in runs]
    return (f"{len(runs)} | {_number(_mean([r['valid_loss'] for r in runs]), 3)} | {_mean(bleu):.2f} | "
            f"{' / '.join(f'{b:.2f}' for b in bleu)} | {_ratio(per_teacher('bleu'))} | "
            f"{_number(_mean([r['tokens_per_second'] for r in runs]), 0)} | {_ratio(per_teacher('tokens_per_second'))}")


def table(results):
    teachers = {t["seed"]: t for t in results["teachers"]}

    def listed(key, digits):
        return " / ".join(_number(t[key], digits) for t in results["teachers"])
    seeds = f"seed{'s' if len(teachers) > 1 else ''} {' / '.join(str(s) for s in teachers)}"
    lines = [f"Teachers: softmax, {results['teachers'][0]['updates']} updates of the `{results['preset']}` preset, "
             f"{seeds}: BLEU {listed('bleu', 2)}, valid loss {listed('valid_loss', 3)}, "
             f"{listed('tokens_per_second', 0)} tokens/s decoding the test split.", "",
             "| configuration | start | total updates | seeds | valid loss | BLEU | BLEU per seed | × teacher BLEU | "
             "tokens/s | × teacher tokens/s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for (config, start, total), runs in groups(results).items():
        lines.append(f"| {config} | {start} | {total} | {row(runs, teachers)} |")
    lines += ["", "Means over the seeds; a ratio is taken against the same seed's teacher, then averaged. "
              "start: scratch = trained from random weights for the total; converted = the teacher's weights, "
              "fine-tuned for the total; distilled = converted, its attention distilled for a quarter of the total "
              "(into the maps, or through the blocks' q, k and beta projections where the map has no parameters), "
              "then fine-tuned for the rest; continued = the teacher itself trained the total more, "
              "with the fine-tuning's schedule. "
              f"{results['machine']}, {results['cpu_count']} threads, torch {results['torch']}; "
              f"{results['wall_minutes']} minutes."]
    return "\n".join(lines) + "\n"


def plot(results, path):
    rows = groups(results)
    configs = sorted({config for config, _, _ in rows})
    fig, axes = plt.subplots(1, len(configs), figsize=(3.2 * len(configs), 3.2), sharey=True, squeeze=False)
    for ax, config in zip(axes[0], configs):
        for start, style in zip(STARTS, ("o:", "d--", "s-", "^-")):
            points = sorted((total, _mean([r["bleu"] for r in runs]))
                            for (c, s, total), runs in rows.items() if c == config and s == start)
            if points:
                ax.plot(*zip(*points), style, label=start)
        teacher = _mean([t["bleu"] for t in results["teachers"]])
        ax.axhline(teacher, color="grey", lw=1, label=f"teacher ({results['teachers'][0]['updates']} u.)")
        ax.set_title(config, fontsize=8)
        ax.set_xlabel("total updates")
        ax.legend(fontsize=6)  # per panel: a map without parameters has no distilled line
    axes[0][0].set_ylabel("test BLEU, mean over the seeds")
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
