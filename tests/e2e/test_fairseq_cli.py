"""End to end through the real CLIs on a tiny corpus: fairseq-preprocess, fairseq-train
--user-dir fw_fairseq (every feature map x update rule), resume from checkpoint_last.pt,
fairseq-generate with beam 4, fairseq-interactive, and sacrebleu on the output; the gated delta
rule with beta in (0, 2) trains, resumes and generates."""
import itertools
import re

import pytest
import sacrebleu

from fairseq_run import USER_DIR, run, train
from fw_fairseq.ops import FEATURE_MAPS, RULES


@pytest.mark.parametrize("feature_map,rule", itertools.product(FEATURE_MAPS, RULES))
def test_train_every_feature_map_and_rule(data_bin, tmp_path, feature_map, rule):
    log = train(data_bin, tmp_path, ["--fw-feature-map", feature_map, "--fw-update-rule", rule],
                "--max-epoch", 1)
    assert (tmp_path / "checkpoint_last.pt").exists()
    losses = [float(x) for x in re.findall(r"\| loss ([0-9.]+)", log)]
    assert losses and all(loss == loss for loss in losses), log[-2000:]  # finite, not NaN


def train_resume_and_generate(data_bin, save_dir, fw, epochs):
    """Train `epochs` epochs, resume for one more, translate the test split with beam 4 and score it."""
    train(data_bin, save_dir, fw, "--max-epoch", epochs)
    resumed = train(data_bin, save_dir, fw, "--max-epoch", epochs + 1)
    # fairseq names the epoch it resumes into, after the finished ones
    assert re.search(rf"Loaded checkpoint .*checkpoint_last\.pt \(epoch {epochs + 1} @ \d+ "
                     r"updates\)", resumed), resumed[-3000:]
    assert f"epoch {epochs + 1:03d}" in resumed

    out = run("fairseq-generate", data_bin / "bin", "--user-dir", USER_DIR,
              "--path", save_dir / "checkpoint_last.pt", "--beam", "4", "--lenpen", "0.6",
              "--batch-size", "8", "--gen-subset", "test",
              # fairseq-fixed's batch_by_size drops a last batch smaller than the multiple (8)
              "--required-batch-size-multiple", "1")
    hyps = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M))
    refs = dict(re.findall(r"^T-(\d+)\t(.*)$", out, flags=re.M))
    assert len(hyps) == len(refs) == 20
    ids = sorted(hyps, key=int)
    bleu = sacrebleu.corpus_bleu([hyps[i] for i in ids], [[refs[i] for i in ids]])
    assert 0.0 <= bleu.score <= 100.0


def test_gated_delta_with_beta_max_2_trains_resumes_and_generates(data_bin, tmp_path):
    train_resume_and_generate(data_bin, tmp_path, ["--fw-feature-map", "dpfp", "--fw-update-rule",
                                                   "gated_delta", "--fw-delta-beta-max", "2"], 1)


def test_resume_generate_interactive_and_bleu(data_bin, tmp_path):
    train_resume_and_generate(data_bin, tmp_path, ["--fw-feature-map", "dpfp", "--fw-update-rule",
                                                   "delta"], 4)

    inter = run("fairseq-interactive", data_bin / "bin", "--user-dir", USER_DIR,
                "--path", tmp_path / "checkpoint_last.pt", "--beam", "4",
                "--source-lang", "en", "--target-lang", "de",
                input="the cat sees the dog\nthe big red house\n")
    assert len(re.findall(r"^H-\d+\t", inter, flags=re.M)) == 2
