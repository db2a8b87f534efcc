"""--fw-align-ratio: on a corpus whose targets run 1.5 times their sources in tokens, `data` counts r = 1.5 from the
training split when the model is built, the checkpoint keeps the number, and the aligned read's weight over the
source peaks within one token of i / r, in the fast-weight read (training equal to generation's steps in float64)
and in softmax's prior; fairseq-train and fairseq-generate run with it."""
import random

import pytest
import torch
from cli_run import TINY_MODEL, TRAIN, USER_DIR, run
from fairseq import checkpoint_utils, options, tasks

from fw_fairseq.decoding.block import Block
from fw_fairseq.models.checkpoints import RECORD, decode
from fw_fairseq.modules.aligned_softmax import aligned_log_window
from fw_fairseq.modules.cross_align import aligned_angles, aligned_read, aligned_step
from fw_fairseq.ops import RULES, feature_map

RATIO = 1.5
WORDS = [f"w{i}" for i in range(12)]


@pytest.fixture(scope="module")
def long_targets(tmp_path_factory):
    """Pairs of n = 3, 5, 7 or 9 source words and 1.5 n + 0.5 target words, so that with each side's end of
    sentence the target has exactly 1.5 times the source's tokens; binarised by fairseq-preprocess (root/bin)."""
    root, rng = tmp_path_factory.mktemp("long_targets"), random.Random(0)
    for split, count in [("train", 60), ("valid", 8), ("test", 8)]:
        pairs = []
        for _ in range(count):
            n = rng.choice([3, 5, 7, 9])
            pairs.append((rng.choices(WORDS, k=n), rng.choices(WORDS, k=(3 * n + 1) // 2)))
        (root / f"{split}.src").write_text("".join(" ".join(s) + "\n" for s, _ in pairs))
        (root / f"{split}.tgt").write_text("".join(" ".join(t) + "\n" for _, t in pairs))
    run("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "train",
        "--validpref", root / "valid", "--testpref", root / "test", "--destdir", root / "bin", "--joined-dictionary",
        "--workers", "1")
    return root


def build_from_data(root, flags):
    """The translation task on the corpus and a transformer_fw built by it, as fairseq-train builds one."""
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(root / "bin"), "--task", "translation", "-s", "src", "-t",
                                                "tgt", "--user-dir", USER_DIR, *TINY_MODEL, *flags])
    task = tasks.setup_task(args)
    return task.build_model(args), args


def test_data_ratio_is_counted_and_recorded(long_targets):
    model, args = build_from_data(long_targets, ["--fw-align-ratio", "data"])
    assert args.fw_align_ratio == RATIO  # the number replaces `data` in the args a checkpoint saves
    assert decode(model.state_dict()[RECORD])["--fw-align-ratio"] == "1.5"
    assert model.decoder.layers[0].encoder_attn.align_ratio == RATIO


def peaks_near_i_over_r(weights, lengths):
    """weights [B, T, S] over sources of `lengths` tokens (unpadded): each target position i whose i / r lies on
    the source puts its largest weight within one token of i / r."""
    for row, length in zip(weights, lengths):
        for i in range(row.size(0)):
            if i / RATIO <= length - 1:
                assert abs(int(row[i].argmax()) - i / RATIO) <= 1, (i, row[i])


def test_fast_weight_read_peaks_at_i_over_r_and_steps_equal_training(long_targets):
    """Keys all alike and one-hot values: the read of target position i is the aligned weight over the source,
    normalised; generation's steps read the same in float64."""
    model, args = build_from_data(long_targets, ["--fw-align-ratio", "data"])
    attention = model.decoder.layers[0].encoder_attn
    block = Block.of(RULES["sum"], feature_map("elu", 4), "sum")  # ELU+1: every phi(q).phi(k) > 0
    lengths, src_len, tgt_len = [9, 5], 9, 14
    mask = torch.zeros(2, src_len, dtype=torch.bool)
    mask[1, :4] = True  # fairseq pads a source on the left
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 1, tgt_len, 4, generator=g, dtype=torch.float64)
    keys = torch.randn(1, 1, 1, 4, generator=g, dtype=torch.float64).expand(2, 1, src_len, 4)
    one_hot = torch.stack([torch.eye(src_len, dtype=torch.float64), torch.eye(src_len, dtype=torch.float64)
                           .roll(4, 0).masked_fill(mask[1][:, None], 0.0)])[:, None]  # [B, 1, S, S]
    read = aligned_read(block, attention.cross_align, attention.align_ratio, q, keys, one_hot, (), mask,
                        torch.float64)  # [B, 1, T, S]: unpadded position j of each source in column j
    peaks_near_i_over_r(read[:, 0], lengths)
    buffer = {}
    steps = [aligned_step(buffer, block, attention.cross_align, attention.align_ratio, q[:, :, t:t + 1],
                          (keys, one_hot, ()) if t == 0 else None, mask, 1) for t in range(tgt_len)]
    torch.testing.assert_close(torch.cat(steps, dim=2), read, rtol=1e-12, atol=1e-12)


def test_softmax_prior_peaks_at_i_over_r(long_targets):
    """A softmax cross-attention's prior over unpadded sources: with equal logits, the window alone."""
    model, args = build_from_data(long_targets, ["--fw-attention", "none", "--fw-cross-align", "4",
                                                 "--fw-align-ratio", "data"])
    attention = model.decoder.layers[0].encoder_attn
    assert (attention.align_order, attention.align_ratio) == (4, RATIO)
    lengths, tgt_len = [9, 5], 14
    positions = torch.arange(tgt_len, dtype=torch.float64).expand(2, -1)
    for length in lengths:
        angles = aligned_angles(None, 1, length, positions[:1], RATIO)
        peaks_near_i_over_r(torch.softmax(aligned_log_window(4, angles), dim=-1), [length])


@pytest.mark.parametrize("attention", ["all", "none"])
def test_train_and_generate_keep_the_counted_ratio(long_targets, tmp_path, attention):
    save = tmp_path / "checkpoints"
    flags = ["--fw-attention", attention, "--fw-cross-align", "4", "--fw-align-ratio", "data", "-s", "src",
             "-t", "tgt"]
    run("fairseq-train", long_targets / "bin", "--user-dir", USER_DIR, *TINY_MODEL, *TRAIN, *flags,
        "--save-dir", save, "--max-update", "2", "--fw-dpfp-nu", "1")
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    assert state["cfg"]["model"].fw_align_ratio == RATIO
    assert decode(state["model"][RECORD])["--fw-align-ratio"] == "1.5"
    out = run("fairseq-generate", long_targets / "bin", "--user-dir", USER_DIR, "--path", save / "checkpoint_last.pt",
              "--beam", "4", "--max-len-b", "20", "-s", "src", "-t", "tgt", "--gen-subset", "valid")
    assert out.count("\nH-") == 8


@pytest.mark.parametrize("value, message", [
    ("data", "argument --fw-align-ratio: data counts the tokens of the training split 'train', which this task cannot "
             "give"),
    ("0", "--fw-align-ratio got '0'; allowed: a number > 0, or data"),
    ("long", "--fw-align-ratio got 'long'; allowed: a number > 0, or data")])
def test_bad_ratios_are_refused_in_one_line(value, message, capsys):
    from factories import build_model
    with pytest.raises(SystemExit) as exit_:
        build_model(["--fw-align-ratio", value])
    # argparse prints its line and exits with 2; the model's build exits with its line
    line = str(exit_.value) if exit_.value.code != 2 else capsys.readouterr().err.strip().splitlines()[-1]
    assert message in line and "\n" not in line
