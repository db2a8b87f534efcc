"""train.sh -> average_checkpoints.py -> evaluate.sh -> table1.py with a tiny model on the
fixture corpus, through the real fairseq-train / fairseq-generate / sacrebleu."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

from conftest import REPO, WMT14, run

from fw_research.wmt14 import table1, wmt_score

# A tiny fast-weight model (d_key = 32) and a short run; appended after the recipe, so they win.
TINY = ["--arch", "transformer_fw_small", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "128",
        "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
        "--max-tokens", "4000", "--update-freq", "1", "--warmup-updates", "5", "--lr", "3e-3",
        "--log-interval", "5", "--num-workers", "0",
        # an untrained model would decode up to 200 tokens a sentence
        "--eval-bleu-args", '{"beam": 2, "max_len_a": 1.2, "max_len_b": 5}']
SHORT = ["--max-len-a", "1.2", "--max-len-b", "5"]


def env(work, data):
    return {"DATA_BIN": str(work / "data-bin" / data), "SAVE_ROOT": str(work / "ckpt"),
            "RESULTS_DIR": str(work / "results")}


@pytest.fixture(scope="module")
def performer_run(prepared):
    """performer_m32 on BPE data: 2 epochs, then a resumed third."""
    work, _ = prepared
    e = env(work, "bpe300")
    first = run([WMT14 / "train.sh", "performer_m32", *TINY, "--max-epoch", "2"], env=e)
    second = run([WMT14 / "train.sh", "performer_m32", *TINY, "--max-epoch", "3"], env=e)
    return work, e, first, second


def test_train_resumes_from_checkpoint_last(performer_run):
    work, _, first, second = performer_run
    save = work / "ckpt" / "performer_m32"
    assert "loaded checkpoint" not in first.stdout.lower()
    # fairseq names the epoch it is about to start
    assert "Loaded checkpoint" in second.stdout and "checkpoint_last.pt (epoch 3 @" in second.stdout
    for name in ("checkpoint1.pt", "checkpoint2.pt", "checkpoint3.pt", "checkpoint_best.pt", "checkpoint_last.pt"):
        assert (save / name).exists()
    state = torch.load(save / "checkpoint3.pt", map_location="cpu", weights_only=False)
    args = state["cfg"]["model"]
    assert (args.fw_feature_map, args.fw_favor_features, args.arch) == ("favor", 32, "transformer_fw_small")
    assert "bleu" in second.stdout  # --eval-bleu ran on the validation set


def test_average_then_evaluate(performer_run):
    work, e, _, _ = performer_run
    save = work / "ckpt" / "performer_m32"
    run([sys.executable, "-m", "fw_research.wmt14.average_checkpoints", "--inputs", save, "-n", "2",
         "--output", save / "avg.pt"])
    avg, c2, c3 = (torch.load(save / n, map_location="cpu", weights_only=False)["model"]
                   for n in ("avg.pt", "checkpoint2.pt", "checkpoint3.pt"))
    projections = [k for k in avg if k.endswith("favor.projection")]
    assert projections and all(torch.equal(avg[k], c3[k]) for k in projections)
    weight = "encoder.layers.0.fc1.weight"
    assert torch.allclose(avg[weight], (c2[weight] + c3[weight]) / 2)

    for ckpt, subset in (("avg.pt", "valid"), ("checkpoint_best.pt", "test")):
        proc = run([WMT14 / "evaluate.sh", save / ckpt, "--subset", subset, "--", *SHORT], env=e)
        stem = str(work / "results" / "performer_m32" / f"{ckpt[:-3]}.{subset}")
        result = json.loads(Path(stem + ".json").read_text())
        assert result["config"] == "performer_m32" and result["subset"] == subset
        assert result["checkpoint"] == str(save / ckpt)
        assert "tok:13a" in result["sacrebleu_signature"]
        n = {"valid": 48, "test": 53}[subset]
        hyps = Path(stem + ".hyp.txt").read_text(encoding="utf-8").splitlines()
        assert result["sentences"] == n and len(hyps) == n
        # the score is the written hypotheses' against the references, in corpus order (the tiny model's is near 0) ...
        data = Path(e["DATA_BIN"])
        refs, refs_tok = (wmt_score.read_lines(data / f"{kind}.{subset}.de") for kind in ("ref", "tok"))
        assert result["sacrebleu"] == round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2)
        # ... and the same scorer gives the references themselves 100 on both metrics
        _, perfect = wmt_score.score(refs_tok, refs, refs_tok)
        assert perfect["sacrebleu"] == perfect["tok_bleu"] == 100.0
        assert "sacreBLEU" in proc.stdout

    table = table1.render(table1.read_configs(REPO / "configs" / "wmt14_en_de"),
                          table1.read_results(work / "results", "checkpoint_best.pt"), "sacrebleu")
    performer = next(line for line in table.splitlines() if line.startswith("| Performer |"))
    assert not performer.split("|")[5].strip().startswith("–")  # our test d_dot=64 cell is filled


def test_sentencepiece_data_train_and_evaluate(prepared_spm):
    work, _ = prepared_spm
    e = env(work, "spm400")
    # linear (sum rule): the delta rule's CPU path is several times slower; test_configs builds it
    run([WMT14 / "train.sh", "linear", *TINY, "--max-update", "3"], env=e)
    ckpt = work / "ckpt" / "linear" / "checkpoint_last.pt"
    run([WMT14 / "evaluate.sh", ckpt, "--name", "spm_linear", "--", *SHORT], env=e)
    result = json.loads((work / "results" / "spm_linear" / "checkpoint_last.test.json").read_text())
    assert result["config"] == "spm_linear" and result["sentences"] == 53
    gen = (work / "results" / "spm_linear" / "checkpoint_last.test.gen.txt").read_text()
    assert "\u2581" not in "".join(l for l in gen.splitlines() if l.startswith("H-"))  # pieces joined


@pytest.mark.parametrize("args, message", [
    (["no_such_config"], "no config file"),
    (["standard"], "no prepared data in"),
])
def test_train_sh_errors(tmp_path, args, message):
    proc = subprocess.run([WMT14 / "train.sh", *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "DATA_BIN": str(tmp_path)})
    assert proc.returncode != 0 and message in proc.stderr
