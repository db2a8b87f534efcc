"""The demo's and compare_attention's corpus: real English/German pairs from the machine's gettext catalogs."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import catalog_corpus as demo  # noqa: E402

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
