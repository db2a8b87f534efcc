"""The demo's and compare_attention's corpus: real English/German pairs from the machine's gettext catalogs."""
import pytest

from fw_research.experiments import catalog_corpus as demo, long_messages

needs_catalogs = pytest.mark.skipif(not any(demo.LOCALE_DIR.glob("*.mo")),
                                    reason="no German gettext catalogs on this machine")


def test_clean_message_drops_mnemonics_and_newlines():
    assert demo.clean_message("_Open  the\tfile") == "Open the file"
    assert demo.clean_message("Save &As") == "Save As"


@needs_catalogs
def test_catalog_pairs_are_real_distinct_sentences():
    pairs = demo.catalog_pairs(demo.LOCALE_DIR)
    assert len(pairs) > 5000
    assert len({en for en, _ in pairs}) == len(pairs)
    assert all(en != de and "\x04" not in en and 2 <= len(en.split()) <= 12 for en, de in pairs)


@needs_catalogs
def test_make_corpus_splits_disjointly(tmp_path):
    sizes = demo.make_corpus(tmp_path, test_size=50)
    assert sizes["test"] == sizes["valid"] == 50 and sizes["train"] > 5000
    test = set((tmp_path / "raw/test.en").read_text().splitlines())
    train = set((tmp_path / "raw/train.en").read_text().splitlines())
    assert not test & train
    for split in ("train", "valid", "test"):
        en = (tmp_path / f"raw/{split}.en").read_text().splitlines()
        de = (tmp_path / f"raw/{split}.de").read_text().splitlines()
        assert len(en) == len(de) == sizes[split]


@pytest.mark.parametrize("lang, line, tokens", [
    ("en", "cannot store %s", "cannot store %s"),
    ("en", "%1$s of %2$d files, %-10lu bytes", "%1$s of %2$d files , %-10lu bytes"),
    ("en", "Open {0} or {name} now", "Open {0} or {name} now"),
    ("en", "%(count)d items, 100%% done", "%(count)d items , 100%% done"),
    ("de", "%s kann nicht gespeichert werden: %s", "%s kann nicht gespeichert werden : %s"),
])
def test_placeholders_stay_one_token_and_detokenise_unchanged(lang, line, tokens):
    from sacremoses import MosesDetokenizer, MosesTokenizer

    tokenized = demo.tokenize(MosesTokenizer(lang=lang), line)
    assert tokenized == tokens
    assert MosesDetokenizer(lang=lang).detokenize(tokenized.split()) == line


def _words(n, word="w"):
    return " ".join(f"{word}{i}" for i in range(n))


def test_long_pairs_keep_long_messages_and_join_the_excluded_middle_lengths():
    catalogs = {
        "a.mo": [(_words(20, "long"), _words(22, "lang")),  # natural: 16-40 words
                 (_words(41, "huge"), _words(41, "riesig")),  # too long
                 (_words(18, "bad"), _words(40, "schlecht")),  # German over twice the English
                 (_words(13, "p"), _words(13, "q")),  # pieces: 13 + 14 words -> one message of 27
                 (_words(8, "train"), _words(8, "zug")),  # an ordinary split's message: never a piece
                 (_words(14, "r") + ".", _words(14, "s") + "."),
                 (_words(15, "t"), _words(15, "u"))],  # a run left at 15 words: dropped
        "b.mo": [(_words(14, "x"), _words(14, "y")), (_words(20, "long"), "other German"),  # a duplicate: first kept
                 (_words(2, "z"), _words(2, "zz"))],  # too short to be a piece
    }
    natural, joined = long_messages.long_pairs(catalogs, exclude={_words(8, "train")})
    assert natural == [(_words(20, "long"), _words(22, "lang"))]
    assert joined == [(_words(13, "p") + ". " + _words(14, "r") + ".", _words(13, "q") + ". " + _words(14, "s") + ".")]
    assert all(16 <= len(en.split()) <= 40 for en, _ in natural + joined)


def test_a_joined_run_never_passes_the_longest():
    catalogs = {"a.mo": [(_words(15, "a"), "x " * 15), (_words(15, "b"), "y " * 15), (_words(15, "c"), "z " * 15)]}
    _, joined = long_messages.long_pairs(catalogs, exclude=set())
    assert [len(en.split()) for en, _ in joined] == [30]  # a + b; c alone stays under 16 words


def test_split_long_is_disjoint_fixed_and_natural_first():
    natural = [(f"n{i}", "") for i in range(5)]
    joined = [(f"j{i}", "") for i in range(10)]
    splits = long_messages.split_long(natural, joined, size=4)
    assert len(splits["test_long"]) == len(splits["valid_long"]) == 4
    chosen = splits["test_long"] + splits["valid_long"]
    assert len(set(chosen)) == 8 and set(natural) <= set(chosen)  # every natural message before any joined one
    assert long_messages.split_long(natural, joined, size=4) == splits  # fixed seeds
    few = long_messages.split_long(natural[:3], [], size=4)  # too few: half each
    assert len(few["test_long"]) == len(few["valid_long"]) == 1


@needs_catalogs
def test_the_long_split_is_long_and_no_model_trains_on_it(tmp_path):
    demo.make_corpus(tmp_path, test_size=50)
    sizes = demo.make_long(tmp_path, size=200)
    assert sizes["test_long"][0] == sizes["valid_long"][0] == 200
    raw = tmp_path / "raw"
    ordinary = {line for split in ("train", "valid", "test") for line in (raw / f"{split}.en").read_text().splitlines()}
    test_long, valid_long = ((raw / f"{split}.en").read_text().splitlines() for split in demo.LONG_SPLITS)
    assert not (set(test_long) | set(valid_long)) & ordinary and not set(test_long) & set(valid_long)
    lengths = [len(line.split()) for line in test_long + valid_long]
    assert min(lengths) >= 16 and max(lengths) <= 40 and 18 <= sum(lengths) / len(lengths) <= 30  # WMT-like
    for split in demo.LONG_SPLITS:
        assert len((raw / f"{split}.de").read_text().splitlines()) == 200


def test_prepare_continues_and_adds_the_long_split_to_an_older_work_dir(tmp_path, monkeypatch):
    calls = []

    def step(name, *outputs):
        def run(work, *args, **kwargs):
            calls.append(name)
            for output in outputs:
                (work / output).parent.mkdir(parents=True, exist_ok=True)
                (work / output).write_text("")
            return {}
        return run
    monkeypatch.setattr(demo, "make_corpus", step("corpus", "raw/test.de"))
    monkeypatch.setattr(demo, "make_subwords", step("subwords", "data-bin/test.en-de.de.idx"))
    monkeypatch.setattr(demo, "make_long", step("long", "raw/test_long.de"))
    monkeypatch.setattr(demo, "make_long_subwords", step("long_subwords", "data-bin/test_long.en-de.de.idx"))
    demo.prepare(tmp_path, 10, 100)
    assert calls == ["corpus", "subwords", "long", "long_subwords"]
    calls.clear()
    assert demo.prepare(tmp_path, 10, 100) == "corpus and subwords: already built" and calls == []
    (tmp_path / "raw/test_long.de").unlink()  # a work dir built before the long split: only it is made
    (tmp_path / "data-bin/test_long.en-de.de.idx").unlink()
    demo.prepare(tmp_path, 10, 100)
    assert calls == ["long", "long_subwords"]


def test_joined_pairs_use_each_training_pair_once_in_order():
    pairs = [(_words(n, f"e{i}_"), _words(n, f"d{i}_")) for i, n in enumerate([5, 6, 7, 30, 12, 2, 3])]
    joined = long_messages.joined_pairs(pairs)
    # 5 + 6 + 7 = 18 words; 30 alone is over 16; 12 + 2 + 3 = 17
    assert [len(en.split()) for en, _ in joined] == [18, 30, 17]
    join = long_messages.join_messages
    assert joined[0] == (join([e for e, _ in pairs[:3]]), join([d for _, d in pairs[:3]]))
    restarted = long_messages.joined_pairs([(_words(15, "a"), "x"), (_words(30, "b"), "y"), (_words(2, "c"), "z")])
    assert restarted == [(join([_words(30, "b")]), "y.")]  # 15 + 30 > 40: the run restarts at the 30 words


def test_the_joined_training_split_joins_catalog_messages_into_20_to_60_words():
    lengths = [2, 12, 7, 3, 9, 11, 5, 8, 4, 10, 6, 12, 2, 3]  # catalog messages: 2-12 words
    pairs = [(_words(n, f"e{i}_"), _words(n, f"d{i}_")) for i, n in enumerate(lengths)]
    joined = long_messages.joined_pairs(pairs, long_messages.JOINED_WORDS)
    assert long_messages.JOINED_WORDS == (20, 60)
    # 2 + 12 + 7 = 21; 3 + 9 + 11 = 23; 5 + 8 + 4 + 10 = 27; the last 6 + 12 + 2 = 20
    assert [len(en.split()) for en, _ in joined] == [21, 23, 27, 20]
