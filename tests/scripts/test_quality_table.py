"""fw_research.demo.quality_table: the README's quality table is the one drawn from the committed comparison reports,
and a folder without one of them is refused in one line."""
from pathlib import Path

import pytest

from fw_research.demo import quality_table

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_holds_the_table_drawn_from_the_committed_reports():
    table = quality_table.table()
    assert table in (REPO / "README.md").read_text()
    assert len(table.splitlines()) == 2 + len(quality_table.ROWS)  # every report has its row
    assert "| demo, 600 | 15.84 / 2.24 | 16.11 / 1.81 |" in table  # softmax's, and with the criterion


def test_a_missing_report_is_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit):
        quality_table.main(["--reports", str(tmp_path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith(f"argument --reports: {tmp_path} has no demo_u600.md")
