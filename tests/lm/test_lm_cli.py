"""End to end through the real CLIs on a small slice of the licence-text corpus (fw_research.demo.lm_demo):
fairseq-preprocess --only-source, fairseq-train --task language_modeling --user-dir (fast-weight
LM and Feedback Transformer) and --task fw_lm_stream --fw-carry-state, fairseq-eval-lm,
fairseq-generate and fairseq-interactive sampling. Training must reduce the loss."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fw_research.demo import lm_demo

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
USER_DIR = str(REPO / "fw_fairseq")

SHAPE = ["--decoder-layers", "1", "--decoder-embed-dim", "32", "--decoder-attention-heads", "2",
         "--decoder-ffn-embed-dim", "64"]
TRAIN = ["--optimizer", "adam", "--lr", "3e-3", "--batch-size", "8", "--tokens-per-sample", "32",
         "--max-update", "40", "--log-format", "simple", "--log-interval", "10", "--seed", "1",
         "--num-workers", "0", "--no-epoch-checkpoints", "--disable-validation"]
MODELS = {
    "fw": ["--task", "language_modeling", "--arch", "transformer_lm_fw_tiny",
           "--sample-break-mode", "none"],
    "feedback": ["--task", "language_modeling", "--arch", "feedback_transformer_lm_tiny",
                 "--sample-break-mode", "none"],
    "fw_carry": ["--task", "fw_lm_stream", "--fw-carry-state", "--arch", "transformer_lm_fw_tiny",
                 "--no-token-positional-embeddings"],
}


def run(tool, *args, stdin=None, check=True):
    result = subprocess.run([str(BIN / tool), *map(str, args)], capture_output=True, text=True,
                            input=stdin, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if check:
        assert result.returncode == 0, \
            f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr if check else result


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    lm_demo.make_corpus(root / "raw", held_out=0.1, max_lines=300)
    run("fairseq-preprocess", "--only-source", "--trainpref", root / "raw/train.txt",
        "--validpref", root / "raw/valid.txt", "--testpref", root / "raw/test.txt",
        "--destdir", root / "bin", "--workers", "1")
    return root / "bin"


@pytest.fixture(scope="module")
def checkpoints(data_bin, tmp_path_factory):
    """Train every model once; returns {name: (checkpoint, training log)}."""
    out = {}
    for name, flags in MODELS.items():
        save = tmp_path_factory.mktemp(name)
        log = run("fairseq-train", data_bin, "--user-dir", USER_DIR, *flags, *SHAPE, *TRAIN,
                  "--save-dir", save)
        out[name] = (save / "checkpoint_last.pt", log)
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_training_reduces_the_loss(checkpoints, name):
    checkpoint, log = checkpoints[name]
    losses = [float(x) for x in re.findall(r"train_inner .*? loss=([0-9.]+)", log)]
    assert checkpoint.exists() and len(losses) >= 3, log[-2000:]
    assert losses[-1] < losses[0] - 0.5, losses  # from ~log2(vocab) towards character statistics


@pytest.mark.parametrize("name", ["fw", "feedback"])
def test_eval_lm_and_sampling(data_bin, checkpoints, name):
    checkpoint = checkpoints[name][0]
    common = [data_bin, "--user-dir", USER_DIR, "--path", checkpoint,
              "--required-batch-size-multiple", "1", "--num-workers", "0"]
    log = run("fairseq-eval-lm", *common, "--gen-subset", "valid", "--tokens-per-sample", "32",
              "--batch-size", "4")
    ppl = float(re.search(r"Perplexity: ([0-9.]+)", log).group(1))
    assert 1 < ppl < 40, log[-1000:]

    # The language_modeling task forces each test block (8 tokens here) as the prefix to
    # continue; --min-len 12 makes a hypothesis sample at least 4 tokens of its own (blocks that
    # end in an end-of-line symbol finish at once, whatever the model).
    generated = run("fairseq-generate", *common, "--task", "language_modeling", "--sampling",
                    "--sampling-topk", "5", "--beam", "1", "--batch-size", "2", "--max-len-b", "20",
                    "--min-len", "12", "--gen-subset", "valid", "--tokens-per-sample", "8",
                    "--seed", "3")
    sources = dict(re.findall(r"^S-(\d+)\t(.*)$", generated, flags=re.M))
    hypotheses = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", generated, flags=re.M))
    assert sources and hypotheses.keys() == sources.keys(), generated[-1000:]
    continued = [hypotheses[i].startswith(sources[i]) and len(hypotheses[i].split()) >= 12
                 for i in sources]
    assert sum(continued) >= 0.8 * len(continued), generated[-1000:]

    prompt = lm_demo.to_chars("This License")
    # fw_lm_stream: language_modeling's prompt dataset fails under numpy 2 (np.compat).
    out = run("fairseq-interactive", *common, "--task", "fw_lm_stream", "--sampling",
              "--sampling-topk", "5", "--beam", "1", "--max-len-b", "24", "--min-len", "24",
              "--seed", "3", stdin=prompt + "\n")
    hypothesis = re.findall(r"^H-\d+\t\S+\t(.*)$", out, flags=re.M)[-1]
    assert len(hypothesis.split()) >= 24 and hypothesis.startswith(prompt), out[-1000:]


def test_eval_lm_with_the_carried_state(data_bin, checkpoints):
    common = [data_bin, "--user-dir", USER_DIR, "--path", checkpoints["fw_carry"][0],
              "--task", "fw_lm_stream", "--tokens-per-sample", "32", "--batch-size", "2",
              "--gen-subset", "valid", "--num-workers", "0"]
    carried = float(re.search(r"Perplexity: ([0-9.]+)",
                              run("fairseq-eval-lm", *common, "--fw-carry-state")).group(1))
    truncated = float(re.search(r"Perplexity: ([0-9.]+)", run("fairseq-eval-lm", *common)).group(1))
    assert 1 < carried < 40 and carried != truncated


@pytest.mark.parametrize("arch,flags,refusal", [
    ("transformer_lm_fw_tiny", ["--fw-feature-map", "favor", "--no-token-positional-embeddings"],
     "argument --fw-carry-state: FAVOR+ redraws its random features at every training step"),
    ("feedback_transformer_lm_tiny", [],
     "argument --fw-carry-state: --arch feedback_transformer_lm_tiny has no fast-weight state"),
])
def test_carried_state_refusals_stop_before_training(data_bin, tmp_path, arch, flags, refusal):
    result = run("fairseq-train", data_bin, "--user-dir", USER_DIR, "--task", "fw_lm_stream",
                 "--fw-carry-state", "--arch", arch, *flags,
                 *SHAPE, *TRAIN, "--save-dir", tmp_path, check=False)
    assert result.returncode != 0 and "Traceback" not in result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"fairseq-train: error: {refusal}")
