"""fw_research.demo.compare_attention's runs through the real fairseq CLIs and sacreBLEU: a fixed number of
updates with a validation curve and a progress bar, scoring, and re-runs that reuse finished runs."""
import json
import re
import shutil
from pathlib import Path

import pytest

from fw_research.demo import compare_attention, compare_report
from fw_research.experiments import attention_runs, valid_scores

REPO = Path(__file__).resolve().parents[2]


def test_a_run_trains_exactly_its_updates_scores_and_is_reused(data_bin, tmp_path, capsys):
    work = tmp_path / "work"
    (work / "raw").mkdir(parents=True)
    (work / "data-bin").symlink_to(data_bin / "bin")
    for split in ("valid", "test"):
        shutil.copy(data_bin / f"{split}.de", work / f"raw/{split}.de")
    # small batches: an epoch of this corpus is many updates, so some log intervals are only training
    flags = compare_attention.model_flags("demo", "dpfp2-delta-dec-l2", seed=1) + ["--max-tokens", "128"]
    record = attention_runs.train_and_score(work, "run", flags, updates=20, valid_every=10)
    curve = dict(record["curve"])  # every 10 updates, and at each epoch's end (a few updates here)
    assert {10, 20} <= set(curve) and max(curve) == 20
    assert curve[20] < curve[10]  # it learns
    assert record["seconds_per_update"] > 0  # from an interval with no validation in it
    references = (work / "raw/test.de").read_text().splitlines()
    # the stored BLEU is sacreBLEU of the stored hypotheses, and the scorer gives the references themselves 100
    assert len(record["hypotheses"]) == 20
    assert record["bleu"] == attention_runs.score(record["hypotheses"], references)["bleu"]
    assert attention_runs.score(references, references)["bleu"] == 100
    assert "20/20 updates" in capsys.readouterr().out  # the progress bar (a line per tenth off a tty)
    log = (work / "train.run.log").read_text()
    assert '"num_updates": "20"' in log and '"num_updates": "30"' not in log
    stored = json.loads((work / "runs/run.json").read_text())
    assert attention_runs.train_and_score(work, "run", flags, updates=20, valid_every=10) == stored  # reused
    # a finished run's checkpoint with its record gone: translated again, not trained a 21st update
    (work / "runs/run.json").unlink()
    again = attention_runs.train_and_score(work, "run", flags, updates=20, valid_every=10)
    assert '"num_updates": "21"' not in (work / "train.run.log").read_text()
    assert again["hypotheses"] == stored["hypotheses"] and again["curve"] == stored["curve"]
    assert 0 < stored["bp"] <= 1 and stored["length_ratio"] > 0 and len(stored["precisions"]) == 4
    _check_the_length_limit(work)

    # the length penalty: picked by BLEU on the valid split, the test split translated with it
    tuned = attention_runs.tune_lenpen(work, "run", [2.0, 0.6])["tuned"]
    assert tuned["grid"] == [0.6, 2.0] and set(tuned["valid_bleu"]) == {"0.6", "2.0"}
    best = max(tuned["valid_bleu"].values())
    assert tuned["valid_bleu"][str(tuned["lenpen"])] == best
    assert tuned["lenpen"] == 0.6 or tuned["valid_bleu"]["0.6"] < best  # the first of equals
    if tuned["lenpen"] == 2.0:
        assert (work / "generate.run.lp2.0.txt").is_file()
    assert 0 < tuned["bp"] <= 1
    if tuned["lenpen"] == attention_runs.LENPEN:  # the default's translation again: the same score
        assert tuned["bleu"] == record["bleu"]
    for lenpen in ("0.6", "2.0"):  # each candidate really translated the valid split with its --lenpen
        log = (work / f"generate.run.valid.lp{lenpen}.txt").read_text()
        assert f"'lenpen': {lenpen}" in log and "loaded 30 examples" in log
    (work / "generate.run.valid.lp0.6.txt").unlink()
    assert attention_runs.tune_lenpen(work, "run", [0.6, 2.0])["tuned"] == tuned  # kept: nothing translated again
    assert not (work / "generate.run.valid.lp0.6.txt").exists()

    # the validation splits the work directory has (valid here, no valid_long): BLEU of the real translation, kept
    scored = valid_scores.score_valid(work, "run")["valid_bleu"]
    hypotheses = [line.split("\t")[2] for line in (work / "generate.run.valid.txt").read_text().splitlines()
                  if line.startswith("D-")]
    assert list(scored) == ["valid"] and len(hypotheses) == 30
    assert scored["valid"] == tuned["valid_bleu"]["0.6"]  # the same split, checkpoint and --lenpen
    (work / "generate.run.valid.txt").unlink()
    assert valid_scores.score_valid(work, "run")["valid_bleu"] == scored
    assert not (work / "generate.run.valid.txt").exists()
    # a new grid takes its --lenpen 0.6 point from that score and translates only the other points
    regrid = attention_runs.tune_lenpen(work, "run", [0.6, 1.0])["tuned"]
    assert regrid["valid_bleu"]["0.6"] == scored["valid"]
    assert not (work / "generate.run.valid.lp0.6.txt").exists()
    assert (work / "generate.run.valid.lp1.0.txt").is_file()


def _check_the_length_limit(work):
    """The test split's 20 sentences are one batch, whose limit fairseq-generate takes from its longest source: no
    translation passes it, and at_length_limit counts every translation cut there."""
    from fairseq.data import indexed_dataset
    dataset = indexed_dataset.make_dataset(str(work / "data-bin/test.en-de.en"), impl="mmap")
    batch_limit = attention_runs.length_limit(int(dataset.sizes.max()))
    lengths = [len(scores.split()) - 1 for scores in  # a score per token, the end of sentence's included
               re.findall(r"^P-\d+\t(.*)$", (work / "generate.run.txt").read_text(), flags=re.M)]
    assert len(lengths) == 20 and max(lengths) <= batch_limit
    counted = len(attention_runs.at_length_limit(work / "generate.run.txt", work / "data-bin", "test"))
    assert lengths.count(batch_limit) <= counted <= 20


@pytest.mark.parametrize("argv,message", [
    (["--configs", "softmax", "linear"], "unknown linear; allowed: softmax, elu-sum"),
    (["--configs", "dpfp2-sum"], "include softmax"),
    (["--updates", "5"], "--updates must be >= 10"),
    (["--lenpen-grid", "0.6", "-1"], "argument --lenpen-grid: values must be >= 0"),
])
def test_bad_arguments_stop_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        compare_attention.parse_args(argv)
    assert message in capsys.readouterr().err


def test_committed_tables_are_generated_from_the_committed_results(tmp_path):
    results = sorted((REPO / "results/compare_attention").rglob("*.json"))  # every run, in subfolders too
    assert results
    for path in results:
        data = json.loads(path.read_text())
        if data["benchmark"] != "compare_attention":  # a diagnosis of such runs (tests/scripts)
            continue
        text = compare_report.write(tmp_path / path.stem, data)
        assert path.with_suffix(".md").read_text() == text
        assert (tmp_path / f"{path.stem}.png").stat().st_size > 10_000
        assert "| softmax | softmax |" in text and "1.00×" in text
        # several seeds: each row's BLEU and valid loss seed by seed, one column per seed
        assert ("seed by seed" in text) == (len({r["seed"] for r in data["runs"]}) > 1)


def test_the_lengths_section_shows_what_the_runs_recorded():
    def run(config, bleu, ratio, tuned=None):
        record = {"config": config, "seed": 1, "curve": [[10, 5.0]], "seconds_per_update": 0.1, "bleu": bleu,
                  "length_ratio": ratio, "precisions": [50.0, 30.0, 20.0, 10.0]}
        return {**record, "tuned": tuned} if tuned else record
    results = {"preset": "demo", "updates": 10, "cpu_count": 2, "torch": "x", "jobs": 1, "seeds": [1],
               "configs": {"softmax": {"kind": "softmax", "flags": []}, "dpfp2-sum": {"kind": "fast", "flags": []}},
               "runs": [run("softmax", 20.0, 0.9), run("dpfp2-sum", 21.0, 0.8)]}
    text = compare_report.table(results)
    assert "Lengths of the test translations:" in text and "picked on valid" not in text
    assert "| dpfp2-sum | 0.800 | 50.00 / 30.00 / 20.00 / 10.00 |" in text
    tuned = {"grid": [0.6, 1.0], "lenpen": 1.0, "bleu": 22.0, "length_ratio": 0.85, "bp": 0.84}
    results["runs"] = [run("softmax", 20.0, 0.9, {**tuned, "bleu": 20.0, "lenpen": 0.6}),
                       run("dpfp2-sum", 21.0, 0.8, tuned)]
    text = compare_report.table(results)
    assert "| dpfp2-sum | 0.800 | 50.00 / 30.00 / 20.00 / 10.00 | 22.00 | 1.10× | 1.0 | 0.850 |" in text


def test_a_merged_results_file_keeps_the_wall_time_and_jobs_of_the_invocations_that_brought_rows():
    def run(config, seed, bleu=20.0):
        return {"config": config, "seed": seed, "curve": [[10, 5.0]], "seconds_per_update": 0.1, "bleu": bleu,
                "length_ratio": 0.9, "precisions": [50.0, 30.0, 20.0, 10.0]}
    softmax, fast = {"kind": "softmax", "flags": []}, {"kind": "fast", "flags": []}
    previous = {"preset": "demo", "updates": 10, "cpu_count": 2, "torch": "x", "jobs": 1, "seeds": [1],
                "wall_minutes": 30.0, "configs": {"softmax": softmax}, "runs": [run("softmax", 1)]}
    results = {**previous, "jobs": 2, "seeds": [1, 2], "wall_minutes": 12.0, "configs": {"softmax": softmax,
               "dpfp2-sum": fast}, "runs": [run("softmax", 1, bleu=21.0), run("dpfp2-sum", 1), run("dpfp2-sum", 2)]}
    merged = compare_attention.merged(previous, results)
    assert (merged["jobs"], merged["wall_minutes"], merged["seeds"]) == ([1, 2], 42.0, [1, 2])
    assert [(r["config"], r["seed"], r["bleu"]) for r in merged["runs"]][0] == ("softmax", 1, 21.0)  # replaced
    assert len(merged["runs"]) == 3 and set(merged["configs"]) == {"softmax", "dpfp2-sum"}
    # an invocation that only reads stored rows the file has adds neither time nor jobs
    again = compare_attention.merged(merged, {**results, "jobs": 3, "wall_minutes": 0.1, "torch": "y",
                                              "device": "another"})
    assert (again["jobs"], again["wall_minutes"]) == ([1, 2], 42.0)
    assert again["torch"] == "x" and "device" not in again  # the machine the rows trained on
    assert compare_attention.merged_jobs([1, 2], [2, 3]) == [1, 2, 3] and compare_attention.merged_jobs(2, 2) == 2
    assert "(1 or 2 at once)" in compare_report.table(merged)
