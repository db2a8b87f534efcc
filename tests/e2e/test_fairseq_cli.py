"""End to end through the real CLIs on a tiny corpus: fairseq-preprocess, fairseq-train
--user-dir fw_fairseq (every feature map x update rule), resume from checkpoint_last.pt,
fairseq-generate with beam 4, fairseq-interactive, and sacrebleu on the output."""
import itertools
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu

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


def run(tool, *args, **kwargs):
    result = subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, **kwargs)
    assert result.returncode == 0, f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def sentences(n, rng):
    words = list(LEXICON)
    for _ in range(n):
        src = rng.choices(words, k=rng.randint(3, 8))
        yield " ".join(src), " ".join(LEXICON[w] for w in src)


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
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


def train(data, save_dir, fw, max_epoch):
    return run("fairseq-train", data / "bin", "--user-dir", USER_DIR, *TINY_MODEL, *TRAIN, *fw,
               "--save-dir", save_dir, "--max-epoch", max_epoch)


@pytest.mark.parametrize("feature_map,rule", itertools.product(["elu", "dpfp", "favor"],
                                                               ["sum", "delta"]))
def test_train_every_feature_map_and_rule(data_bin, tmp_path, feature_map, rule):
    log = train(data_bin, tmp_path, ["--fw-feature-map", feature_map, "--fw-update-rule", rule], 1)
    assert (tmp_path / "checkpoint_last.pt").exists()
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+)", log)]
    assert losses and all(loss == loss for loss in losses), log[-2000:]  # finite, not NaN


def test_resume_generate_interactive_and_bleu(data_bin, tmp_path):
    fw = ["--fw-feature-map", "dpfp", "--fw-update-rule", "delta"]
    train(data_bin, tmp_path, fw, 4)
    resumed = train(data_bin, tmp_path, fw, 5)
    # fairseq names the epoch it resumes into: 5, after 4 finished ones
    assert re.search(r"Loaded checkpoint .*checkpoint_last\.pt \(epoch 5 @ \d+ updates\)",
                     resumed), resumed[-3000:]
    assert "epoch 005" in resumed

    out = run("fairseq-generate", data_bin / "bin", "--user-dir", USER_DIR,
              "--path", tmp_path / "checkpoint_last.pt", "--beam", "4", "--lenpen", "0.6",
              "--batch-size", "8", "--gen-subset", "test",
              # fairseq-fixed's batch_by_size drops a last batch smaller than the multiple (8)
              "--required-batch-size-multiple", "1")
    hyps = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M))
    refs = dict(re.findall(r"^T-(\d+)\t(.*)$", out, flags=re.M))
    assert len(hyps) == len(refs) == 20
    ids = sorted(hyps, key=int)
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in ids], [[refs[i] for i in ids]])
    assert 0.0 <= bleu.score <= 100.0

    inter = run("fairseq-interactive", data_bin / "bin", "--user-dir", USER_DIR,
                "--path", tmp_path / "checkpoint_last.pt", "--beam", "4",
                "--source-lang", "en", "--target-lang", "de",
                input="the cat sees the dog\nthe big red house\n")
    assert len(re.findall(r"^H-\d+\t", inter, flags=re.M)) == 2
