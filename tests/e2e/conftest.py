import random

import pytest
from cli_run import run, sentences


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory):
    """400/30/20 En->De word-for-word pairs, binarised by fairseq-preprocess (root/bin)."""
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    for split, n in [("train", 400), ("valid", 30), ("test", 20)]:
        pairs = list(sentences(n, rng))
        (root / f"{split}.en").write_text("".join(s + "\n" for s, _ in pairs))
        (root / f"{split}.de").write_text("".join(t + "\n" for _, t in pairs))
    dest = root / "bin"
    run("fairseq-preprocess", "--source-lang", "en", "--target-lang", "de",
        "--trainpref", root / "train", "--validpref", root / "valid", "--testpref", root / "test",
        "--destdir", dest, "--joined-dictionary", "--workers", "1")
    return root
