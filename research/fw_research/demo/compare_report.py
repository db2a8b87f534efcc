"""The table (Markdown) and the valid-loss curves (PNG) of a compare_attention result file.

Each configuration's numbers are means over its seeds; its BLEU ratio is taken against softmax's mean over
the same seeds (paired: rows run with fewer seeds are not compared with a mean of more), from the same
file (same preset and updates). Used by fw_research.demo.compare_attention, also with --report-only.
"""
import statistics
from pathlib import Path

from fw_research.experiments import valid_scores
from fw_research.experiments.reports import mean as _mean, plt


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
        rows[name] = {"kind": config["kind"], "flags": config["flags"], "seeds": sorted(r["seed"] for r in runs),
                      "bleu_by_seed": {r["seed"]: r["bleu"] for r in runs},
                      "loss_by_seed": {r["seed"]: r["curve"][-1][1] if r["curve"] else None for r in runs},
                      "bleu": statistics.fmean(bleus), "bleu_sd": statistics.pstdev(bleus),
                      "valid_loss": curve[-1][1] if curve else None,
                      "seconds_per_update": _mean([r["seconds_per_update"] for r in runs]), "curve": curve,
                      "length_ratio": _mean([r.get("length_ratio") for r in runs]),
                      "precisions": [_mean(values) for values in zip(*(r["precisions"] for r in runs
                                                                       if "precisions" in r))],
                      "tuned_by_seed": {r["seed"]: r["tuned"]["bleu"] for r in runs if "tuned" in r},
                      "tuned_lenpens": sorted({r["tuned"]["lenpen"] for r in runs if "tuned" in r}),
                      "tuned_length_ratio": _mean([r["tuned"]["length_ratio"] for r in runs if "tuned" in r]),
                      "profiles": {"test": _mean_profile([r["profile"] for r in runs if "profile" in r]),
                                   "test_long": _mean_profile([r["long"]["profile"] for r in runs if "long" in r])},
                      "long_bleu": _mean([r["long"]["bleu"] for r in runs if "long" in r]),
                      "long_length_ratio": _mean([r["long"]["length_ratio"] for r in runs if "long" in r])}
    return rows


def _mean_profile(profiles):
    """The mean over seeds of translation_lengths.length_profile()s (None where no run has one): per bucket the BLEU and
    length ratio, the repetition rate and the counts: over twice the reference, looping inside a word only, at the
    length limit and of them looping."""
    if not profiles:
        return None
    names = list(profiles[0]["buckets"])
    return {"buckets": {name: {"n": profiles[0]["buckets"][name]["n"],
                               "bleu": _mean([p["buckets"][name]["bleu"] for p in profiles]),
                               "length_ratio": _mean([p["buckets"][name]["length_ratio"] for p in profiles])}
                        for name in names},
            "n": profiles[0]["n"], "repetition_rate": _mean([p["repetition_rate"] for p in profiles]),
            "over_twice": _mean([p["over_twice"] for p in profiles]), "runs": len(profiles),
            "over_twice_tokens": _mean_of_all(profiles, "over_twice_tokens"),
            **{key: _mean_of_all(profiles, key) for key in ("at_limit", "loops_in_words", "at_limit_loops")}}


def _mean_of_all(profiles, key):
    """The mean of a count over the runs, None where a run made before the count existed lacks it: a mean of the
    others would not be the row's."""
    return _mean([p[key] for p in profiles]) if all(key in p for p in profiles) else None


def paired(row, ref):
    """row's mean BLEU over its seeds / the reference's mean over those seeds (None if it lacks one, or scored 0:
    a model trained too briefly to translate)."""
    if not set(row["seeds"]) <= set(ref["seeds"]):
        return None
    mean = statistics.fmean(ref["bleu_by_seed"][s] for s in row["seeds"])
    return row["bleu"] / mean if mean > 0 else None


def _ratio_text(value):
    return "–" if value is None else f"{value:.2f}×"


def _lr(flags):
    return flags[flags.index("--lr") + 1] if "--lr" in flags else None


def reference(rows, row):
    """The softmax row a row is compared with: the one trained with the same --lr override (none: softmax)."""
    return next((ref for ref in rows.values() if ref["kind"] == "softmax" and _lr(ref["flags"]) == _lr(row["flags"])),
                rows["softmax"])


def table(results):
    rows = summarise(results)
    ref = rows["softmax"]
    seeds = sorted({r["seed"] for r in results["runs"]})
    training = (", trained on the training split plus its pairs joined into long messages"
                if results.get("training") == "joined" else "")
    lines = [f"{results['preset']} preset{training}, {results['updates']} updates, seeds {seeds}, "
             f"{results['cpu_count']} threads, torch {results['torch']}"
             + (f", on {results['device']}" if results.get("device") else ""),
             "", "| configuration | kind | seeds | BLEU | × softmax (same seeds, same --lr) | valid loss | s / update | "
             "× softmax time |", "|---|---|---|---:|---:|---:|---:|---:|"]
    ratios = {name: paired(row, reference(rows, row)) for name, row in rows.items()}
    for name, row in rows.items():
        spread = f" ± {row['bleu_sd']:.2f}" if len(row["seeds"]) > 1 else ""
        time_ratio = _ratio(row["seconds_per_update"] or 0, ref["seconds_per_update"])
        seconds = f"{row['seconds_per_update']:.3f}" if row["seconds_per_update"] else "–"
        loss = f"{row['valid_loss']:.3f}" if row["valid_loss"] is not None else "–"
        lines.append(f"| {name} | {row['kind']} | {','.join(map(str, row['seeds']))} | {row['bleu']:.2f}{spread} | "
                     f"{_ratio_text(ratios[name])} | "
                     f"{loss} | {seconds} | {time_ratio} |")
    fast = {name: row for name, row in rows.items() if row["kind"] == "fast"}
    if fast:
        ranked = sorted(fast, key=lambda name: ratios[name] or 0.0)  # rows with no paired ratio first
        worst, best = ranked[0], ranked[-1]
        lines += ["", f"Fast-weight rows: best {best} {_ratio_text(ratios[best])} softmax BLEU, "
                      f"worst {worst} {_ratio_text(ratios[worst])}."]
    lines += by_seed(rows, seeds)
    lines += lengths(rows, seeds)
    lines += by_source_length(rows)
    lines += valid_scores.selection(results)
    lines.append(f"\nSeconds per update are wall time of training updates in this run "
                 f"({' or '.join(map(str, job_counts(results['jobs'])))} "
                 "at once): rows trained at different times on a shared machine do not compare.")
    lines.append("\nFlags of each configuration (beyond the preset's model and optimiser):\n")
    lines += [f"- `{name}`: `{' '.join(row['flags'])}`" for name, row in rows.items()]
    return "\n".join(lines) + "\n"


def by_seed(rows, seeds):
    """Where several seeds ran: each row's BLEU (and final valid loss) seed by seed, so that rows are compared on
    the same seeds (a seed moves BLEU on 500 short test sentences by more than some rows differ)."""
    if len(seeds) < 2:
        return []
    return _seed_table("BLEU (final valid loss) seed by seed:", rows, seeds, lambda row, s: (
        f"{row['bleu_by_seed'][s]:.2f} ({row['loss_by_seed'][s]:.3f})"
        if s in row["bleu_by_seed"] and row["loss_by_seed"][s] is not None
        else f"{row['bleu_by_seed'][s]:.2f}" if s in row["bleu_by_seed"] else ""))


def _seed_table(title, rows, seeds, cell):
    """A titled table of one column per seed: cell(row, seed) for each configuration's row."""
    return ["", title, "", "| configuration | " + " | ".join(f"seed {s}" for s in seeds) + " |",
            "|---|" + "---:|" * len(seeds)] + [
        f"| {name} | " + " | ".join(cell(row, s) for s in seeds) + " |" for name, row in rows.items()]


def lengths(rows, seeds):
    """Where runs recorded them: the test hypotheses' length over the references' (BLEU's brevity penalty takes
    what falls short of 1) and n-gram precisions, and where runs picked a --lenpen on the valid split
    (--lenpen-grid), BLEU with it, its ratio to softmax's on the same seeds, and seed by seed."""
    if not any(row["length_ratio"] is not None or row["tuned_by_seed"] for row in rows.values()):
        return []
    tuned_any = any(row["tuned_by_seed"] for row in rows.values())
    ref = rows["softmax"]
    header = "| configuration | length ratio (--lenpen 0.6) | 1/2/3/4-gram precisions (--lenpen 0.6) |"
    if tuned_any:
        header += " BLEU, --lenpen picked on valid | × softmax (same seeds) | --lenpen picked | length ratio with it |"
    lines = ["", "Lengths, and the length penalty picked on the valid split (per run, from --lenpen-grid; the test "
                 "split only scores it):" if tuned_any else "Lengths of the test translations:", "", header,
             "|---|---:|---:|" + ("---:|---:|---|---:|" if tuned_any else "")]
    for name, row in rows.items():
        ratio = f"{row['length_ratio']:.3f}" if row["length_ratio"] is not None else "–"
        precisions = " / ".join(f"{p:.2f}" for p in row["precisions"]) or "–"
        line = f"| {name} | {ratio} | {precisions} |"
        tuned = row["tuned_by_seed"]
        if tuned_any:
            bleu = statistics.fmean(tuned.values()) if tuned else None
            paired = (bleu / statistics.fmean(ref["tuned_by_seed"][s] for s in tuned)
                      if tuned and set(tuned) <= set(ref["tuned_by_seed"]) else None)
            tuned_ratio = f"{row['tuned_length_ratio']:.3f}" if row["tuned_length_ratio"] is not None else "–"
            line += (f" {'–' if bleu is None else f'{bleu:.2f}'} | {_ratio_text(paired)} | "
                     f"{', '.join(map(str, row['tuned_lenpens'])) or '–'} | {tuned_ratio} |")
        lines.append(line)
    if len(seeds) > 1 and tuned_any:
        lines += _seed_table("BLEU with the --lenpen picked on valid, seed by seed:", rows, seeds, lambda row, s: (
            f"{row['tuned_by_seed'][s]:.2f}" if s in row["tuned_by_seed"] else ""))
    return lines


def _number(value, digits=2):
    return "–" if value is None else f"{value:.{digits}f}"


def _share(value, profile):
    return "–" if value is None else f"{100 * value / profile['n']:.1f}%"


def _count(value, profile):
    return _number(value, 1)


# counts made after the first reports, a column where a row of the report has them: (key, header, what it counts,
# its cell from the value and the profile)
LATER_COUNTS = (
    ("loops_in_words", "loops in a word", "the share that loops inside a word only (a piece of up to 8 characters 4 "
                                          "times in a row: a subword written again and again)", _share),
    ("at_limit", "at the limit", "and the number that ran to the length limit (1.2 × their source's subword tokens "
                                 "+ 10, where generation cuts a translation that has not ended)", _count),
    ("at_limit_loops", "of them looping", "and how many of those loop, across words or inside one", _count))


def by_source_length(rows):
    """Where runs recorded them (translation_lengths.length_profile): for the test split and the long split (test_long,
    messages of 16-40 words that no model trained on) BLEU and the length ratio per source-length bucket, the share
    of translations with a loop and the number over twice their reference's length (means over the seeds), and the
    LATER_COUNTS where a row has them: the reports made before them keep their columns."""
    splits = [split for split in ("test", "test_long") if any(row["profiles"][split] for row in rows.values())]
    if not splits:
        return []
    first = next(row["profiles"][splits[0]] for row in rows.values() if row["profiles"][splits[0]])
    names = list(first["buckets"])
    later = [(key, header, text, cell) for key, header, text, cell in LATER_COUNTS
             if any(row["profiles"][split] and row["profiles"][split][key] is not None
                    for row in rows.values() for split in splits)]
    lines = ["", "Lengths by source length (English words; BLEU, then the translations' length over the references' "
                 "in sacreBLEU's tokens), the share of translations that loop (a token or an n-gram, n ≤ 4, 4 times "
                 "in a row) and the number longer than twice their reference, in words and in tokens (both sides "
                 "tokenised as the corpus is: a detokenised `» %c «` is three words)"
             + "".join(f", {text}" for _, _, text, _ in later) + "; means over the seeds:", "",
             "| configuration | split | " + " | ".join(f"BLEU {n}" for n in names) + " | "
             + " | ".join(f"length {n}" for n in names) + " | loops | > 2× reference | in tokens |"
             + "".join(f" {header} |" for _, header, _, _ in later),
             "|---|---|" + "---:|" * (2 * len(names) + 3 + len(later))]
    for split in splits:
        for name, row in rows.items():
            profile = row["profiles"][split]
            if not profile:
                continue
            buckets = profile["buckets"]
            sizes = "/".join(str(buckets[n]["n"]) for n in names)
            lines.append(f"| {name} | {split} ({sizes}) | "
                         + " | ".join(_number(buckets[n]["bleu"]) for n in names) + " | "
                         + " | ".join(_number(buckets[n]["length_ratio"], 3) for n in names) + " | "
                         + f"{100 * profile['repetition_rate']:.1f}% | {_number(profile['over_twice'], 1)} of "
                           f"{profile['n']} | {_number(profile.get('over_twice_tokens'), 1)} |"
                         + "".join(f" {cell(profile.get(key), profile)} |" for key, _, _, cell in later))
    if "test_long" in splits:
        lines += ["", "The long split as a whole (sacreBLEU, length ratio): " + "; ".join(
            f"{name} {_number(row['long_bleu'])} ({_number(row['long_length_ratio'], 3)})"
            for name, row in rows.items() if row["long_bleu"] is not None) + "."]
    return lines


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


def job_counts(jobs):
    """A results file's jobs at once (a count, or a list of counts where invocations differed) as a list."""
    return jobs if isinstance(jobs, list) else [jobs] if jobs else []


def write(stem, results):
    """stem.md and stem.png from `results`; returns the table."""
    text = table(results)
    Path(stem).with_suffix(".md").write_text(text)
    plot(results, Path(stem).with_suffix(".png"))
    return text
