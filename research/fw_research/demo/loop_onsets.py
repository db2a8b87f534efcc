"""Where the translations start to loop, and how often a loop runs away: per configuration of a compare_attention
results file, from the run records of its work directory (runs/NAME.json keeps each run's translations of the test
split and of test_long).

Per configuration, the results file's runs pooled:

  loops             translations of test_long with a loop (translation_lengths.loop_span on the detokenised words)
  > 2x reference    translations of test_long with more than twice their reference's words (the runaways)
  per loop          runaways over loops: how often a loop, once started, runs on
  onsets            per span of word positions of a translation, the loops that start there (their first repeating
                    word) per 1 000 words translated there before any loop; on the test split and on test_long, so
                    that the same positions can be compared under a short and a long source

    python -m fw_research.demo.loop_onsets --work-dir compare_work/base \\
        --results results/compare_attention/long_outputs/base_u2000.json --out PREFIX

Without --work-dir, for one or more results files: the loops, the runaways and the runaways per loop only.

Prints a markdown table; with --out writes PREFIX.md and PREFIX.json.
"""
import argparse
import json
import sys
from pathlib import Path

from fw_research.experiments import attention_runs, translation_lengths

SPANS = ((1, 4), (5, 8), (9, 16), (17, 32), (33, None))  # word positions in a translation, from 1
FEWEST_WORDS = 100  # fewer words at risk in a span print as "–": too few for a rate


def onsets(hypotheses):
    """{"at_risk", "starts"}, one entry per SPANS span: the words translated there before any loop (the loop's first
    repeating word included), and the loops whose first repeating word is there."""
    at_risk, starts = [0] * len(SPANS), [0] * len(SPANS)
    for text in hypotheses:
        words = text.split()
        span = translation_lengths.loop_span(words)
        last = span[0] + 1 if span else len(words)  # positions 1..last were at risk
        for k, (low, high) in enumerate(SPANS):
            at_risk[k] += max(0, min(last, high or last) - low + 1)
            starts[k] += bool(span) and low <= last <= (high or last)
    return {"at_risk": at_risk, "starts": starts}


def pooled(counts):
    """The sum of onsets() results, span by span."""
    return {key: [sum(c[key][k] for c in counts) for k in range(len(SPANS))] for key in ("at_risk", "starts")}


def record_of(work, run):
    """The work directory's record of a results file's run; stops with one line where it is missing or is not the
    run the results file reports (trained again since)."""
    name = attention_runs.run_name(run["config"], run["seed"], run["updates"])
    path = Path(work) / "runs" / f"{name}.json"
    if not path.is_file():
        sys.exit(f"{path} is missing: --work-dir must be the directory the results file's runs trained in")
    record = json.loads(path.read_text())
    long = record.get("long", {})
    if "hypotheses" not in long:
        sys.exit(f"{path} has no test_long translations: run compare_attention.py on it again to add them")
    if record["bleu"] != run["bleu"] or long["profile"] != run["long"]["profile"]:
        sys.exit(f"{path} is not the run {name} of the results file (trained again since?)")
    return record


def measure(results, work=None, configs=None):
    """{configuration: {"runs", "loops", "over_twice", "translations"}, with "test" and "test_long" (pooled
    onsets()) where the work directory is given}, in the results file's row order."""
    rows = {}
    for run in results["runs"]:
        if configs and run["config"] not in configs:
            continue
        row = rows.setdefault(run["config"], {"runs": 0, "loops": 0, "over_twice": 0, "translations": 0})
        profile = run["long"]["profile"]
        row["runs"] += 1
        row["loops"] += profile["loops"]
        row["over_twice"] += profile["over_twice"]
        row["translations"] += profile["n"]
        if work is not None:
            record = record_of(work, run)
            for subset, hypotheses in (("test", record["hypotheses"]), ("test_long", record["long"]["hypotheses"])):
                row.setdefault(subset, []).append(onsets(hypotheses))
    for row in rows.values():
        for subset in ("test", "test_long"):
            if subset in row:
                row[subset] = pooled(row[subset])
    return rows


def rate(counts, k):
    at_risk = counts["at_risk"][k]
    return "–" if at_risk < FEWEST_WORDS else f"{1000 * counts['starts'][k] / at_risk:.1f}"


def span_name(low, high):
    return f"{low}–{high}" if high else f"{low}–"


def table(rows):
    """The markdown table of measure()'s rows: the onset columns where the rows have them."""
    with_onsets = all("test" in row for row in rows.values())
    spans = "".join(f" words {span_name(*span)} |" for span in SPANS) if with_onsets else ""
    lines = [f"| configuration | runs | loops | > 2× reference | per loop |{spans}",
             "|---|---:|---:|---:|---:|" + ("---:|" * len(SPANS) if with_onsets else "")]
    for config, row in rows.items():
        per_loop = f"{row['over_twice'] / row['loops']:.3f}" if row["loops"] else "–"
        cells = "".join(f" {rate(row['test'], k)} · {rate(row['test_long'], k)} |"
                        for k in range(len(SPANS))) if with_onsets else ""
        lines.append(f"| {config} | {row['runs']} | {row['loops']} of {row['translations']} | {row['over_twice']} "
                     f"| {per_loop} |{cells}")
    return "\n".join(lines)


def section(results, rows):
    onsets_said = ("; onsets: loops starting per 1 000 words translated before any loop, at those word positions "
                   f"of the translation, test split · test_long (– where fewer than {FEWEST_WORDS} words)"
                   if all("test" in row for row in rows.values()) else "")
    return (f"## {results['preset']} preset, {results['updates']} updates\n\nLoops and translations over twice "
            f"their reference on test_long, summed over the runs{onsets_said}.\n\n{table(rows)}\n")


def read_results(path):
    try:
        results = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        sys.exit(f"--results {path}: not a readable results file ({error})")
    if results.get("benchmark") != "compare_attention":
        sys.exit(f"--results {path}: not a compare_attention results file")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", nargs="+", required=True, help="compare_attention results files (.json)")
    parser.add_argument("--work-dir", help="the work directory of the runs of one results file: adds the onsets")
    parser.add_argument("--configs", nargs="+", help="only these configurations")
    parser.add_argument("--out", help="write PREFIX.md and PREFIX.json")
    args = parser.parse_args(argv)
    if args.work_dir and len(args.results) > 1:
        sys.exit(f"--work-dir: the runs of one results file, not {len(args.results)}")
    sections, measured = [], []
    for path in args.results:
        results = read_results(path)
        rows = measure(results, args.work_dir, args.configs)
        if not rows:
            sys.exit(f"--configs: none of {args.configs} is in {path}")
        sections.append(section(results, rows))
        measured.append({"results": str(path), "preset": results["preset"], "updates": results["updates"],
                         "configs": rows})
    text = "# Where loops start and how often they run away\n\n" + "\n".join(sections)
    print(text)
    if args.out:
        Path(f"{args.out}.md").write_text(text)
        Path(f"{args.out}.json").write_text(json.dumps({"benchmark": "loop_onsets", "spans": SPANS,
                                                        "settings": measured}, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
