"""Running the real fairseq CLIs on the tiny En->De corpus of tests/e2e (see conftest.py)."""
import os
import subprocess
import sys
from pathlib import Path

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]
USER_DIR = str(REPO / "fw_fairseq")
LEXICON = {"the": "die", "cat": "katze", "dog": "hund", "sees": "sieht", "eats": "isst",
           "small": "kleine", "big": "grosse", "red": "rote", "house": "haus", "and": "und",
           "bird": "vogel", "loves": "liebt", "fish": "fisch", "old": "alte", "green": "gruene"}
TINY_MODEL = ["--arch", "transformer_fw_small", "--encoder-layers", "1", "--decoder-layers", "1",
              "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
              "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
              "--share-all-embeddings"]
TRAIN = ["--optimizer", "adam", "--lr", "0.002", "--max-tokens", "1024", "--dropout", "0.1",
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--no-progress-bar", "--log-interval", "1", "--seed", "1", "--num-workers", "0",
         "--fw-dpfp-nu", "1", "--fw-favor-features", "16"]


def _run(tool, args, kwargs):
    return subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, **kwargs)


def run(tool, *args, **kwargs):
    result = _run(tool, args, kwargs)
    assert result.returncode == 0, f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def run_refused(tool, *args, **kwargs):
    """The last line of stderr of a run that must fail with a message and no traceback."""
    result = _run(tool, args, kwargs)
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"{tool} did not fail:\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    return result.stderr.strip().splitlines()[-1]


def sentences(n, rng):
    words = list(LEXICON)
    for _ in range(n):
        src = rng.choices(words, k=rng.randint(3, 8))
        yield " ".join(src), " ".join(LEXICON[w] for w in src)


def train(data, save_dir, fw, *limit, tool=run):
    """fairseq-train on the corpus; `limit` e.g. ("--max-epoch", 1)."""
    return tool("fairseq-train", data / "bin", "--user-dir", USER_DIR, *TINY_MODEL, *TRAIN, *fw,
                "--save-dir", save_dir, *limit)
