"""fw_research.demo.loop_onsets: where loops start and how often they run away, on hand-made run records of a
compare_attention work directory: seconds, no model."""
import json

import pytest

from fw_research.demo import loop_onsets


def test_each_word_before_a_loop_is_at_risk_and_the_loop_starts_at_its_first_repeat():
    counts = loop_onsets.onsets([
        "a b c",  # no loop: words 1-3 at risk
        "a die die die die b",  # the loop's first repeating word is word 3: words 1-3 at risk, a start at 3
        " ".join(f"w{i}" for i in range(10)) + " x x x x",  # 10 words, then a loop from word 12
    ])
    assert counts == {"at_risk": [3 + 3 + 4, 4, 4, 0, 0], "starts": [1, 0, 1, 0, 0]}


def test_a_loop_past_the_last_span_counts_there():
    counts = loop_onsets.onsets([" ".join(f"w{i}" for i in range(40)) + " x x x x"])
    assert counts["starts"] == [0, 0, 0, 0, 1]
    assert counts["at_risk"] == [4, 4, 8, 16, 10]  # words 33-42, the first repeat (word 42) included


def run(config, seed, long_hypotheses, references):
    over = sum(len(h.split()) > 2 * len(r.split()) for h, r in zip(long_hypotheses, references))
    profile = {"n": len(long_hypotheses), "loops": sum(bool(loop_onsets.translation_lengths.loop_span(h.split()))
                                                      for h in long_hypotheses), "over_twice": over}
    public = {"config": config, "seed": seed, "updates": 600, "bleu": 10.0, "long": {"profile": profile}}
    record = {"bleu": 10.0, "hypotheses": ["a b"], "long": {"profile": profile, "hypotheses": long_hypotheses}}
    return public, record


@pytest.fixture
def work(tmp_path):
    references = ["eins zwei", "drei vier"]
    runs = [run("softmax", 1, ["eins zwei", "drei vier"], references),
            run("dpfp2-sum-vconv3", 1, ["eins eins eins eins eins", "drei vier"], references),
            run("dpfp2-sum-vconv3", 2, ["eins zwei", "drei drei drei drei drei"], references)]
    (tmp_path / "runs").mkdir()
    for public, record in runs:
        name = f"{public['config']}.s{public['seed']}.u600"
        (tmp_path / "runs" / f"{name}.json").write_text(json.dumps(record))
    results = {"benchmark": "compare_attention", "preset": "demo", "updates": 600, "runs": [p for p, _ in runs]}
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def test_configurations_pool_their_seeds_in_the_results_files_order(work, capsys):
    loop_onsets.main(["--work-dir", str(work), "--results", str(work / "results.json"), "--out", str(work / "o")])
    rows = json.loads((work / "o.json").read_text())["settings"][0]["configs"]
    assert list(rows) == ["softmax", "dpfp2-sum-vconv3"]
    assert rows["dpfp2-sum-vconv3"]["runs"] == 2 and rows["dpfp2-sum-vconv3"]["loops"] == 2
    assert rows["dpfp2-sum-vconv3"]["over_twice"] == 2  # 5 and 4 words against 2
    assert rows["dpfp2-sum-vconv3"]["test_long"]["starts"] == [2, 0, 0, 0, 0]
    text = (work / "o.md").read_text()
    assert "| dpfp2-sum-vconv3 | 2 | 2 of 4 | 2 | 1.000 |" in text
    assert "| softmax | 1 | 0 of 2 | 0 | – |" in text
    assert text in capsys.readouterr().out


def test_a_record_trained_again_since_stops_with_one_line(work):
    path = work / "runs/softmax.s1.u600.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "bleu": 11.0}))
    with pytest.raises(SystemExit, match="is not the run softmax.s1.u600 of the results file"):
        loop_onsets.main(["--work-dir", str(work), "--results", str(work / "results.json")])


@pytest.mark.parametrize("argv, message", [
    (["--results", "missing.json"], "--results missing.json: not a readable results file"),
    (["--configs", "favor"], "--configs: none of ['favor'] is in"),
    (["--results", "a.json", "b.json"], "--work-dir: the runs of one results file, not 2"),
])
def test_bad_arguments_stop_with_one_line(work, argv, message):
    argv = ["--work-dir", str(work), "--results", str(work / "results.json"), *argv]
    with pytest.raises(SystemExit, match=message.replace("[", r"\[").replace("]", r"\]")):
        loop_onsets.main(argv)


def test_without_the_work_directory_only_the_results_files_are_read(work, capsys):
    results = str(work / "results.json")
    loop_onsets.main(["--results", results, results])
    text = capsys.readouterr().out
    assert text.count("## demo preset, 600 updates") == 2
    assert "| dpfp2-sum-vconv3 | 2 | 2 of 4 | 2 | 1.000 |\n" in text and "words 1–4" not in text
