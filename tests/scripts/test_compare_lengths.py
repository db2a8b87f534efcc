"""fw_research.demo.compare_attention's length measures (fw_research.experiments.translation_lengths, and
attention_runs.measure_lengths) and their section of the report (fw_research.demo.compare_report), on hand-made
translations: seconds, no model."""
import json

import pytest
import sacrebleu

from fw_research.demo import compare_attention, compare_report
from fw_research.experiments import attention_runs, translation_lengths


@pytest.mark.parametrize("text, loops", [
    ("puis puis puis puis", True),  # a token 4 times
    ("puis puis puis", False),  # 3 times is not a loop
    ("Datei puis puis puis puis nicht gefunden", True),  # anywhere in the sentence
    ("a b a b a b a b", True),  # a bigram 4 times
    ("a b a b a b a", False),  # 3.5 times
    ("x a b c a b c a b c a b c", True),  # a trigram 4 times, after another word
    ("a b c d a b c d a b c d a b c d", True),  # a 4-gram 4 times
    ("a b c d e a b c d e a b c d e a b c d e", False),  # a 5-gram is beyond n <= 4
    ("puis a puis b puis c puis d", False),  # often, but never in a row
    ("die Datei wurde nicht gefunden", False),
    ("", False),
])
def test_the_repetition_detector(text, loops):
    assert translation_lengths.repeats(text.split()) is loops


@pytest.mark.parametrize("text, loops", [
    ("Die Datenbank @-@ CLCKKKKKKKKK", True),  # a character 4 times in a row inside a word
    ("in der LLEEEPLUPLUPLUPLU", True),  # a piece of 3
    ("Tardwareardwareardwareardware", True),  # a piece of 7
    ("abcdefghiabcdefghiabcdefghiabcdefghi", False),  # a piece of 9 is beyond 8 characters
    ("Kommata Kommata", False),
    ("Vorlage enthält nicht XXX", False),  # 3 times is not a loop
])
def test_the_detector_of_a_loop_inside_a_word(text, loops):
    assert translation_lengths.repeats_in_a_word(text) is loops


def test_loops_inside_words_only_are_counted_apart_from_loops_across_words():
    hypotheses = ["Die CLCKKKKKKK", "puis puis puis puis", "puis puis puis puis KKKK", "die Datei"]
    assert translation_lengths.loops_in_words_only(hypotheses) == 1  # the third loops across words as well
    assert [translation_lengths.loops(h) for h in hypotheses] == [True, True, True, False]
    assert translation_lengths.length_profile(hypotheses, ["a"] * 4, ["x"] * 4)["loops_in_words"] == 1


@pytest.mark.parametrize("words, bucket", [(1, "≤5"), (5, "≤5"), (6, "6–15"), (15, "6–15"), (16, ">15"), (40, ">15")])
def test_source_length_buckets(words, bucket):
    assert translation_lengths.bucket_of(words) == bucket


def test_length_profile_on_hand_made_translations():
    sources = ["one two three", "a b c d e f g", "a b c d e f g h", " ".join("w" * 3 for _ in range(20))]
    references = ["eins zwei drei", "die Datei wurde nicht gefunden", "das Verzeichnis ist leer", "ein langer Satz"]
    hypotheses = ["eins zwei drei",  # exact
                  "die Datei wurde nicht gefunden",  # exact
                  "das Verzeichnis ist ist ist ist leer",  # a loop, 7 words: not over 2 x 4
                  "ein langer Satz puis puis puis puis"]  # a loop, 7 words > 2 x 3
    profile = translation_lengths.length_profile(hypotheses, references, sources)
    assert {name: b["n"] for name, b in profile["buckets"].items()} == {"≤5": 1, "6–15": 2, ">15": 1}
    assert profile["buckets"]["≤5"]["bleu"] == pytest.approx(sacrebleu.corpus_bleu(["eins zwei drei"],
                                                                                  [["eins zwei drei"]]).score, abs=0.01)
    middle = sacrebleu.corpus_bleu(hypotheses[1:3], [references[1:3]])  # the bucket's own corpus BLEU, not a mean
    assert profile["buckets"]["6–15"]["bleu"] == pytest.approx(middle.score, abs=0.01)
    assert profile["buckets"]["6–15"]["length_ratio"] == pytest.approx((5 + 7) / (5 + 4), abs=1e-4)
    assert profile["buckets"][">15"]["length_ratio"] == pytest.approx(7 / 3, abs=1e-4)
    assert profile["buckets"]["≤5"]["length_ratio"] == 1.0
    assert profile["loops"] == 2 and profile["repetition_rate"] == 0.5 and profile["over_twice"] == 1
    assert profile["over_twice_tokens"] == 1


def test_a_detokenised_quote_is_not_counted_over_twice_in_tokens():
    """Moses does not join German quotes again: » %c « is three words where the reference's »%c« is one."""
    references = ["»%c« oder »%s«", "eins zwei"]
    hypotheses = ["» %c « oder » %s «", "eins zwei zwei zwei zwei"]
    assert translation_lengths.length_profile(hypotheses, references, ["a", "b"])["over_twice"] == 2
    assert translation_lengths.over_twice_in_tokens(hypotheses, references) == 1  # the loop only


def test_an_empty_bucket_has_no_bleu_and_mismatched_lists_stop():
    profile = translation_lengths.length_profile(["a b"], ["a b"], ["x y"])
    assert profile["buckets"][">15"] == {"n": 0, "bleu": None, "length_ratio": None}
    with pytest.raises(ValueError, match="2 hypotheses, 1 references"):
        translation_lengths.length_profile(["a", "b"], ["a"], ["x"])


def _run(config, seed, bleu, test_profile, long_profile=None):
    record = {"config": config, "seed": seed, "curve": [[10, 5.0]], "seconds_per_update": 0.1, "bleu": bleu,
              "profile": test_profile}
    if long_profile:
        record["long"] = {"bleu": 10.0, "length_ratio": 1.5, "profile": long_profile}
    return record


def _profile(bleus, ratios, rate, over, n=100):
    names = [name for name, _, _ in translation_lengths.BUCKETS]
    return {"buckets": {name: {"n": 0 if b is None else 10, "bleu": b, "length_ratio": r}
                        for name, b, r in zip(names, bleus, ratios)},
            "n": n, "loops": round(rate * n), "repetition_rate": rate, "over_twice": over,
            "over_twice_tokens": over // 2}


def test_the_report_shows_lengths_by_bucket_loops_and_the_long_split():
    results = {"preset": "demo", "updates": 10, "cpu_count": 2, "torch": "x", "jobs": 1, "seeds": [1, 2],
               "configs": {"softmax": {"kind": "softmax", "flags": []}, "delta": {"kind": "fast", "flags": []}},
               "runs": [_run("softmax", 1, 20.0, _profile([30.0, 20.0, None], [0.9, 0.95, None], 0.0, 0)),
                        _run("delta", 1, 21.0, _profile([31.0, 21.0, None], [0.9, 0.9, None], 0.02, 1),
                             _profile([None, None, 8.0], [None, None, 1.9], 0.3, 40)),
                        _run("delta", 2, 23.0, _profile([33.0, 23.0, None], [1.0, 1.0, None], 0.04, 3),
                             _profile([None, None, 10.0], [None, None, 1.7], 0.1, 20))]}
    text = compare_report.table(results)
    assert "Lengths by source length" in text
    # means over the two seeds: BLEU 32 / 22, length 0.95, loops 3 %, 2 over twice (in tokens 0 and 1); no >15
    # sources in the test split
    assert "| delta | test (10/10/0) | 32.00 | 22.00 | – | 0.950 | 0.950 | – | 3.0% | 2.0 of 100 | 0.5 |" in text
    assert "| delta | test_long (0/0/10) | – | – | 9.00 | – | – | 1.800 | 20.0% | 30.0 of 100 | 15.0 |" in text
    del results["runs"][2]["long"]["profile"]["over_twice_tokens"]  # a run that counted words only: no mean
    assert "| 20.0% | 30.0 of 100 | – |" in compare_report.table(results)
    assert "| softmax | test (10/10/0) |" in text and "| softmax | test_long" not in text
    assert "at the limit" not in text  # no run counted at the length limit: the report keeps its columns
    for run in results["runs"]:
        for profile in (run["profile"], run.get("long", {}).get("profile")):
            if profile:
                profile["at_limit"] = profile["over_twice"] // 4
    limited = compare_report.table(results)
    assert "| loops | > 2× reference | in tokens | at the limit |" in limited
    assert "| 20.0% | 30.0 of 100 | – | 7.5 |" in limited  # (10 + 5) / 2 at the limit
    del results["runs"][2]["profile"]["at_limit"]  # a run made before the count: no mean
    assert "| 3.0% | 2.0 of 100 | 0.5 | – |" in compare_report.table(results)
    assert "loops in a word" not in limited and "of them looping" not in limited
    for run in results["runs"]:
        for profile in (run["profile"], run.get("long", {}).get("profile")):
            if profile:
                profile.update(loops_in_words=profile["over_twice"], at_limit_loops=profile["over_twice"] // 8)
    looping = compare_report.table(results)
    assert "| loops | > 2× reference | in tokens | loops in a word | at the limit | of them looping |" in looping
    # the long split: (40 + 20) / 2 translations of 100 loop inside a word only, (5 + 2) / 2 at the limit loop
    assert "| 20.0% | 30.0 of 100 | – | 30.0% | 7.5 | 3.5 |" in looping
    assert "The long split as a whole (sacreBLEU, length ratio): delta 10.00 (1.500)." in text
    for run in results["runs"]:  # results recorded before the lengths were measured: no section
        del run["profile"]
        run.pop("long", None)
    assert "Lengths by source length" not in compare_report.table(results)


def test_the_results_file_keeps_numbers_not_translations():
    record = {"bleu": 1.0, "hypotheses": ["a"], "long": {"bleu": 2.0, "hypotheses": ["b"], "profile": {}}}
    assert compare_attention.without_hypotheses(record) == {"bleu": 1.0, "long": {"bleu": 2.0, "profile": {}}}
    assert record["long"]["hypotheses"] == ["b"]  # the record itself is not changed


def test_the_base_preset_is_spelled_out():
    """3+3 layers, 256 dim, 4 heads (d_key 64), FFN 512, warm-up 300: nothing left to the architecture's defaults."""
    merges, arch, optim = compare_attention.PRESETS["base"]
    flags = {flag: value for flag, value in zip(arch, arch[1:]) if flag.startswith("--")}
    assert merges == 8000 and flags["--arch"] == "transformer_fw_small"
    for side in ("encoder", "decoder"):
        assert flags[f"--{side}-layers"] == "3" and flags[f"--{side}-embed-dim"] == "256"
        assert flags[f"--{side}-attention-heads"] == "4" and flags[f"--{side}-ffn-embed-dim"] == "512"
    assert optim[optim.index("--warmup-updates") + 1] == "300"
    assert compare_attention.parse_args(["--preset", "base"]).preset == "base"
    assert set(compare_attention.PRESETS) == {"demo", "base"}


def test_measure_lengths_adds_the_long_split_to_stored_records_once(tmp_path, monkeypatch):
    work = tmp_path
    (work / "raw").mkdir()
    (work / "runs").mkdir()
    (work / "checkpoints/run").mkdir(parents=True)
    (work / "checkpoints/run/checkpoint_last.pt").write_text("")
    (work / "raw/test.en").write_text("open the file now\n")
    (work / "raw/test.de").write_text("öffne die Datei jetzt\n")
    long_source = " ".join(["word"] * 20)
    (work / "raw/test_long.en").write_text(long_source + "\n")
    (work / "raw/test_long.de").write_text("ein langer Satz\n")
    (work / "runs/run.json").write_text('{"bleu": 50.0, "hypotheses": ["öffne die Datei jetzt"]}')
    record = attention_runs.measure_lengths(work, "run")  # no long split in data-bin: the test profile only
    assert record["profile"]["buckets"]["≤5"]["bleu"] == 100.0 and "long" not in record
    (work / "data-bin").mkdir()
    (work / "data-bin/test_long.en-de.de.idx").write_text("")
    calls = []

    def translate(data, checkpoint, out, subset="test", lenpen=0.6, threads=None, extra=()):
        calls.append(subset)
        return ["ein langer Satz puis puis puis puis"]
    monkeypatch.setattr(attention_runs, "translate", translate)
    record = attention_runs.measure_lengths(work, "run")
    assert calls == ["test_long"]
    assert record["long"]["profile"]["loops"] == 1 and record["long"]["profile"]["over_twice"] == 1
    assert record["long"]["profile"]["buckets"][">15"]["n"] == 1 and record["long"]["length_ratio"] > 2
    assert attention_runs.measure_lengths(work, "run") == record and calls == ["test_long"]  # stored: not again
    assert record["long"]["profile"]["over_twice_tokens"] == 1


def test_measure_lengths_counts_in_tokens_where_a_record_counted_words_only(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "raw/test.de").write_text("»%c« fehlt\n")
    (tmp_path / "raw/test_long.de").write_text("ein Satz\n")
    profile = {"n": 1, "over_twice": 1}
    record = {"hypotheses": ["» %c « fehlt"], "profile": dict(profile),
              "long": {"hypotheses": ["ein Satz Satz Satz Satz Satz"], "profile": dict(profile)}}
    (tmp_path / "runs/run.json").write_text(json.dumps(record))
    record = attention_runs.measure_lengths(tmp_path, "run")
    assert record["profile"]["over_twice_tokens"] == 0 and record["long"]["profile"]["over_twice_tokens"] == 1
    assert json.loads((tmp_path / "runs/run.json").read_text()) == record


@pytest.mark.parametrize("pieces, span", [
    ("a die die die die b".split(), (2, 5)),  # the repeating positions: from the second "die" on
    ("x a b a b a b a b y".split(), (3, 9)),  # a bigram: from its second occurrence to the stretch's end
    ("a b c d".split(), None),
])
def test_the_span_of_a_loop_is_where_it_repeats(pieces, span):
    assert translation_lengths.loop_span(pieces) == span


def _binarised_sources(data, subset, sizes):
    """data/{subset}.en-de.en as fairseq-preprocess writes it (mmap): a sentence of each size, its end of sentence
    included."""
    import torch
    from fairseq.data import indexed_dataset
    prefix = str(data / f"{subset}.en-de.en")
    builder = indexed_dataset.make_builder(prefix + ".bin", impl="mmap", vocab_size=100)
    for size in sizes:
        builder.add_item(torch.full((size,), 4, dtype=torch.int32))
    builder.finalize(prefix + ".idx")


def test_at_length_limit_counts_the_translations_that_ran_to_their_sources_limit(tmp_path):
    # sources of 4 and 9 tokens: limits int(1.2 x 4 + 10) = 14 and int(1.2 x 9 + 10) = 20 tokens
    _binarised_sources(tmp_path, "test_long", [4, 9])
    out = tmp_path / "generate.txt"

    def scores(sentence, tokens):  # a score per token and one for the end of sentence, as fairseq-generate prints
        return f"H-{sentence}\t-1.0\tx\nP-{sentence}\t" + " ".join(["-0.5"] * (tokens + 1)) + "\n"
    out.write_text(scores(0, 14) + scores(1, 19))  # the first at its limit, the second one token short of it
    assert attention_runs.at_length_limit(out, tmp_path, "test_long") == [0]
    out.write_text(scores(1, 20) + scores(0, 13))  # in fairseq's order (by length), not the split's
    assert attention_runs.at_length_limit(out, tmp_path, "test_long") == [1]
    # the first past its own limit (14) and ended below its batch's (the longer source's 20): counted too
    out.write_text(scores(0, 17) + scores(1, 20))
    assert attention_runs.at_length_limit(out, tmp_path, "test_long") == [0, 1]


def test_measure_lengths_counts_at_the_limit_from_the_work_directorys_generate_output(tmp_path):
    (tmp_path / "raw").mkdir()
    (tmp_path / "runs").mkdir()
    (tmp_path / "data-bin").mkdir()
    (tmp_path / "raw/test.de").write_text("ein Satz\n")
    _binarised_sources(tmp_path / "data-bin", "test", [3])  # a limit of int(1.2 x 3 + 10) = 13 tokens
    record = {"hypotheses": ["ein Satz KKKKKKKKKKKK"],
              "profile": {"n": 1, "over_twice": 0, "over_twice_tokens": 0}}
    (tmp_path / "runs/run.json").write_text(json.dumps(record))
    record = attention_runs.measure_lengths(tmp_path, "run")  # no generate output kept: no count at the limit
    assert "at_limit" not in record["profile"] and record["profile"]["loops_in_words"] == 1
    (tmp_path / "generate.run.txt").write_text("P-0\t" + " ".join(["-0.1"] * 14) + "\n")
    record = attention_runs.measure_lengths(tmp_path, "run")
    assert record["profile"]["at_limit"] == 1 and record["profile"]["at_limit_loops"] == 1
    assert json.loads((tmp_path / "runs/run.json").read_text()) == record
    # a record counted at the limit before its loops were: they are added, the count stays
    record["profile"] = {"n": 1, "over_twice": 0, "over_twice_tokens": 0, "at_limit": 1}
    record["hypotheses"] = ["ein Satz"]
    (tmp_path / "runs/run.json").write_text(json.dumps(record))
    profile = attention_runs.measure_lengths(tmp_path, "run")["profile"]
    assert profile["at_limit"] == 1 and profile["at_limit_loops"] == 0 and profile["loops_in_words"] == 0


def test_a_reference_that_scored_nothing_gives_no_ratio():
    row = {"bleu": 0.4, "seeds": [1]}
    assert compare_report.paired(row, {"seeds": [1], "bleu_by_seed": {1: 0.0}}) is None
    assert compare_report.paired(row, {"seeds": [1], "bleu_by_seed": {1: 0.2}}) == pytest.approx(2.0)
