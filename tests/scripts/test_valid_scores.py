"""The report's section on the validation splits (fw_research.experiments.valid_scores): each configuration's mean
BLEU over its seeds, and the fast-weight configuration the fixed rule chooses, with its test and long-split BLEU."""
from fw_research.demo import compare_report
from fw_research.experiments import valid_scores


def run(config, seed, valid, valid_long, test, long=None):
    record = {"config": config, "seed": seed, "curve": [[10, 5.0]], "seconds_per_update": 0.1, "bleu": test,
              "valid_bleu": {"valid": valid, "valid_long": valid_long}}
    return {**record, "long": {"bleu": long}} if long is not None else record


def results(*runs):
    return {"preset": "demo", "updates": 10, "cpu_count": 2, "torch": "x", "jobs": 1, "seeds": [1, 2],
            "configs": {"softmax": {"kind": "softmax", "flags": []}, "sum": {"kind": "fast", "flags": []},
                        "aligned": {"kind": "fast", "flags": []}},
            "runs": list(runs)}


def test_the_choice_is_the_fast_weight_row_with_the_best_mean_of_both_splits():
    # "aligned" wins on valid, "sum" on the mean of both; softmax's higher mean does not count: it is the baseline
    lines = valid_scores.selection(results(
        run("softmax", 1, 30.0, 20.0, 25.0, 6.0), run("softmax", 2, 30.0, 20.0, 25.0, 6.0),
        run("sum", 1, 20.0, 10.0, 21.0, 3.0), run("sum", 2, 22.0, 12.0, 23.0, 5.0),
        run("aligned", 1, 23.0, 6.0, 30.0, 9.0), run("aligned", 2, 23.0, 6.0, 30.0, 9.0)))
    text = "\n".join(lines)
    assert "| softmax | 2 | 30.00 | 20.00 | 25.00 |" in text
    assert "| sum | 2 | 21.00 | 11.00 | 16.00 |" in text
    assert "| aligned | 2 | 23.00 | 6.00 | 14.50 |" in text
    assert lines[-1] == "Chosen on the validation splits: sum; its test BLEU 22.00, long split 4.00."


def test_runs_without_validation_scores_add_no_section():
    plain = results(run("softmax", 1, 0, 0, 25.0), run("sum", 1, 0, 0, 21.0))
    for r in plain["runs"]:
        del r["valid_bleu"]
    assert valid_scores.selection(plain) == []
    assert "validation splits" not in compare_report.table({**plain, "seeds": [1]})


def test_a_split_some_runs_lack_is_left_out_of_the_choice():
    partial = results(run("softmax", 1, 30.0, 20.0, 25.0), run("sum", 1, 20.0, 10.0, 21.0),
                      run("aligned", 1, 18.0, 30.0, 30.0))
    del partial["runs"][2]["valid_bleu"]["valid_long"]
    lines = valid_scores.selection(partial)
    assert "| configuration | seeds | valid | mean |" in lines
    assert lines[-1] == "Chosen on the validation splits: sum; its test BLEU 21.00."
