"""The README's quality table, drawn from the committed comparison reports (results/compare_attention/long_outputs/
aligned_unlikelihood/*.md, each written by fw_research.demo.compare_attention).

    python -m fw_research.demo.quality_table

For each report (a preset and its updates) and each column's configuration: mean test BLEU / long-split BLEU over the
report's seeds, the best of each in bold, "–" where the report has no such row; the last column counts the long
translations over twice their reference, summed over the seeds, of softmax and the default. The README holds the table
as printed; tests/scripts/test_quality_table.py checks that it does.
"""
import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
REPORTS = REPO / "results/compare_attention/long_outputs/aligned_unlikelihood"
# (row label, report file)
ROWS = [("demo, 600", "demo_u600.md"), ("demo, 2 000", "demo_u2000.md"), ("base, 600", "base_u600.md"),
        ("base, 2 000", "base_u2000.md"), ("demo, 600, joined messages", "demo_joined_u600.md")]
# (column heading, configuration): softmax, softmax with what the default has beyond fast weights, the paper's rule,
# the default
COLUMNS = [("softmax", "softmax"), ("+ criterion", "softmax-ul2"), ("+ prior", "softmax-align4"),
           ("the sum rule", "dpfp2-sum-vconv3"), ("the default", "dpfp2-delta-dec-align4-ul2-vconv3")]
RUNAWAYS = ("softmax", "dpfp2-delta-dec-align4-ul2-vconv3")
LONG_LINE = "The long split as a whole (sacreBLEU, length ratio): "


def cells(line):
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def read_report(path):
    """{config: {"test": BLEU, "long": BLEU, "over_twice": count summed over the seeds}} of a report."""
    lines = path.read_text().splitlines()
    rows, header = {}, None
    for line in lines:
        if line.startswith("| configuration | kind | seeds | BLEU |"):
            header = "main"
        elif header == "main" and line.startswith("| ") and not line.startswith("|---"):
            config, _, seeds, bleu = cells(line)[:4]
            rows[config] = {"test": float(bleu.split()[0]), "seeds": len(seeds.split(","))}
        elif header == "main" and not line.startswith("|"):
            header = None
        if line.startswith("| configuration | split |"):
            header = cells(line)
        elif isinstance(header, list) and line.startswith("| ") and "test_long" in line:
            row = dict(zip(header, cells(line)))
            config = row["configuration"]
            rows[config]["over_twice"] = round(float(row["> 2× reference"].split()[0]) * rows[config]["seeds"])
        if line.startswith(LONG_LINE):
            for config, bleu in re.findall(r"(\S+) ([\d.]+) \([\d.]+\)", line[len(LONG_LINE):]):
                rows[config]["long"] = float(bleu)
    return rows


def bold(text, best):
    return f"**{text}**" if best else text


def cell(values, best):
    """"test / long" of a configuration's values, each in bold where it is the row's best (both at once)."""
    test, long = (f"{values[split]:.2f}" for split in ("test", "long"))
    if best["test"] and best["long"]:
        return bold(f"{test} / {long}", True)
    return f"{bold(test, best['test'])} / {bold(long, best['long'])}"


def table_row(label, rows):
    present = [config for _, config in COLUMNS if config in rows]
    top = {split: max(rows[config][split] for config in present) for split in ("test", "long")}
    out = [cell(rows[config], {split: rows[config][split] == top[split] for split in top}) if config in rows
           else "–" for _, config in COLUMNS]
    runaways = " / ".join(str(rows[config]["over_twice"]) for config in RUNAWAYS)
    return f"| {label} | {' | '.join(out)} | {runaways} |"


def table(reports=REPORTS):
    head = ("| preset, updates | " + " | ".join(name for name, _ in COLUMNS) +
            " | long translations over twice their reference: softmax / default |")
    rule = "|---|" + "---:|" * (len(COLUMNS) + 1)
    return "\n".join([head, rule, *(table_row(label, read_report(Path(reports) / name)) for label, name in ROWS)])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reports", type=Path, default=REPORTS, help="the folder of the reports")
    args = parser.parse_args(argv)
    missing = [name for _, name in ROWS if not (args.reports / name).is_file()]
    if missing:
        parser.error(f"argument --reports: {args.reports} has no {missing[0]}")
    print(table(args.reports))


if __name__ == "__main__":
    main(sys.argv[1:])
