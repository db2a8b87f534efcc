"""The conversion study's table over several seeds (fw_research.convert.convert_report): means over the seeds, and
each ratio taken against the same seed's teacher before it is averaged."""
from fw_research.convert import convert_report


def _run(seed, bleu, tokens, config="dpfp2-sum-vconv3", start="converted"):
    return {"seed": seed, "config": config, "start": start, "total": 400, "bleu": bleu, "valid_loss": 4.0,
            "tokens_per_second": tokens}


RESULTS = {"preset": "demo", "machine": "x86_64", "cpu_count": 1, "torch": "2", "wall_minutes": 1.0,
           "teachers": [{"seed": 1, "updates": 2000, "bleu": 20.0, "valid_loss": 4.0, "tokens_per_second": 100.0},
                        {"seed": 2, "updates": 2000, "bleu": 40.0, "valid_loss": 3.0, "tokens_per_second": 200.0}],
           "runs": [_run(1, 20.0, 100.0), _run(2, 20.0, 400.0), _run(1, 5.0, 50.0, start="scratch")]}


def test_rows_are_means_over_seeds_and_ratios_are_per_seed():
    table = convert_report.table(RESULTS)
    assert "seeds 1 / 2: BLEU 20.00 / 40.00" in table
    # BLEU mean 20; against each seed's own teacher 1.0 and 0.5 -> 0.75 (not 20 / mean(20, 40) = 0.67)
    assert "| dpfp2-sum-vconv3 | converted | 400 | 2 | 4.000 | 20.00 | 20.00 / 20.00 | 0.75× | 250 | 1.50× |" in table
    assert "| dpfp2-sum-vconv3 | scratch | 400 | 1 | 4.000 | 5.00 | 5.00 | 0.25× | 50 | 0.50× |" in table
    assert table.index("| scratch |") < table.index("| converted |")  # the table's order of starts


def test_plot_is_written(tmp_path):
    text = convert_report.write(tmp_path / "demo", RESULTS)
    assert (tmp_path / "demo.md").read_text() == text and (tmp_path / "demo.png").stat().st_size > 0
