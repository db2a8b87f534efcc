"""A user's mistakes with checkpoints and flags end in one line naming the flag or the file, not
in a traceback or a silently wrong model: real fairseq-train / fairseq-generate runs."""
import shutil
import struct
import zipfile

import pytest
import torch

from cli_run import USER_DIR, run, run_refused, train

DPFP_DELTA = ["--fw-feature-map", "dpfp", "--fw-update-rule", "delta"]  # nu 1 (cli_run.TRAIN)


@pytest.fixture(scope="module")
def dpfp_checkpoint(data_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("dpfp1")
    train(data_bin, save_dir, DPFP_DELTA, "--max-update", 2)
    return save_dir / "checkpoint_last.pt"


@pytest.mark.parametrize("changed,refusal", [
    (["--fw-feature-map", "elu"], "--fw-feature-map dpfp, not elu"),
    (["--fw-dpfp-nu", "2"], "--fw-dpfp-nu 1, not 2"),
    (["--fw-delta-beta-max", "2"], "--fw-delta-beta-max 1, not 2"),
    # the translation preset's prior follows the cross-attention (4 with fast weights, 0 with softmax),
    # so the refusal names both settings that differ from the checkpoint's
    (["--fw-attention", "encoder,decoder"],
     "--fw-attention encoder,decoder,cross, not encoder,decoder; --fw-cross-align 4, not 0"),
])
def test_resume_refuses_other_attention_settings(data_bin, dpfp_checkpoint, tmp_path, changed,
                                                 refusal):
    shutil.copy(dpfp_checkpoint, tmp_path / "checkpoint_last.pt")
    line = train(data_bin, tmp_path, DPFP_DELTA + changed, "--max-update", 4, tool=run_refused)
    assert line.startswith("fairseq-train: error: ") and "checkpoint_last.pt was trained with " \
        f"{refusal} " in line, line


def test_generate_refuses_model_overrides_of_the_attention(data_bin, dpfp_checkpoint):
    line = run_refused("fairseq-generate", data_bin / "bin", "--user-dir", USER_DIR,
                       "--path", dpfp_checkpoint, "--gen-subset", "test", "--batch-size", "4",
                       "--model-overrides", "{'fw_update_rule': 'sum', 'fw_decoder_rule': 'sum'}")
    assert line.startswith("fairseq-generate: error: ") and \
        f"{dpfp_checkpoint} was trained with --fw-update-rule delta, not sum " in line, line


def _damaged(checkpoint, tmp_path):
    """A truncated copy and one whose pickle starts with a byte no unpickler knows."""
    data = checkpoint.read_bytes()
    truncated, bad_pickle = tmp_path / "truncated.pt", tmp_path / "bad_pickle.pt"
    truncated.write_bytes(data[: len(data) // 2])
    header = next(i for i in zipfile.ZipFile(checkpoint).infolist()
                  if i.filename.endswith("data.pkl")).header_offset
    # the local header's name and extra-field lengths (torch pads the extra field)
    name_len, extra_len = struct.unpack("<HH", data[header + 26: header + 30])
    start = header + 30 + name_len + extra_len
    bad_pickle.write_bytes(data[:start] + b"\xff" + data[start + 1:])
    return truncated, bad_pickle


def test_damaged_checkpoints_are_named(data_bin, dpfp_checkpoint, tmp_path):
    truncated, bad_pickle = _damaged(dpfp_checkpoint, tmp_path)
    generated = run_refused("fairseq-generate", data_bin / "bin", "--user-dir", USER_DIR,
                            "--path", truncated, "--gen-subset", "test")
    assert generated.startswith(f"fairseq-generate: error: {truncated} is corrupt or truncated")
    shutil.copy(bad_pickle, tmp_path / "checkpoint_last.pt")  # resuming reads the same loader
    resumed = train(data_bin, tmp_path, DPFP_DELTA, "--max-update", 4, tool=run_refused)
    assert resumed.startswith("fairseq-train: error: ") and \
        "checkpoint_last.pt is corrupt or truncated" in resumed, resumed
    assert "weights_only" not in generated + resumed


@pytest.mark.parametrize("flags,refusal", [
    # TINY_MODEL: 64 dims, 2 heads, so d_key = 32 and nu <= 63
    (["--fw-dpfp-nu", "64"], "argument --fw-dpfp-nu: 64 is too large for encoder attention "
     "(d_key = --encoder-embed-dim 64 / --encoder-attention-heads 2 = 32); allowed: 1..63 "
     "(2*d_key-1)"),
    (["--decoder-attention-heads", "3"], "argument --decoder-attention-heads: 3 heads do not "
     "divide --decoder-embed-dim 64; allowed: a divisor of 64"),
])
def test_shape_errors_stop_at_argument_parsing(data_bin, tmp_path, flags, refusal):
    line = train(data_bin, tmp_path, ["--fw-feature-map", "dpfp"] + flags, tool=run_refused)
    assert line == f"fairseq-train: error: {refusal}"
    assert not (tmp_path / "checkpoint_last.pt").exists()


def test_ema_copies_favor_projections_instead_of_averaging_them(data_bin, tmp_path):
    """--store-ema averages the weights; a FAVOR+ projection is a random draw (redrawn at every
    step), so the EMA model keeps the model's current draw."""
    train(data_bin, tmp_path,
          ["--fw-feature-map", "favor", "--fw-favor-redraw", "batch", "--store-ema", "--ema-decay", "0.5"],
          "--max-update", 3)
    state = torch.load(tmp_path / "checkpoint_last.pt", weights_only=False)
    model, ema = state["model"], state["extra_state"]["ema"]
    projections = [k for k in model if k.endswith("favor.projection")]
    assert len(projections) == 3  # one layer each: encoder self-, decoder self-, cross-attention
    assert all(torch.equal(ema[k], model[k]) for k in projections)
    assert not torch.equal(ema["encoder.layers.0.fc1.weight"], model["encoder.layers.0.fc1.weight"])


def test_generate_and_interactive_without_user_dir_still_load_the_plugin(data_bin, dpfp_checkpoint):
    """The installed hydra_plugins/fw_fairseq_autoload hook loads the plugin (before, torch.load raised
    UnpicklingError about weights_only). fairseq-train without it stops earlier, at argument parsing
    (--arch transformer_fw_small: invalid choice), one line."""
    generated = run("fairseq-generate", data_bin / "bin", "--path", dpfp_checkpoint, "--gen-subset", "test",
                    "--batch-size", "4", "--beam", "2", "--required-batch-size-multiple", "1")
    assert len([line for line in generated.splitlines() if line.startswith("H-")]) == 20
    interactive = run("fairseq-interactive", data_bin / "bin", "--path", dpfp_checkpoint, "--beam", "2",
                      "--source-lang", "en", "--target-lang", "de", input="the cat sees the dog\n")
    assert any(line.startswith("H-0") for line in interactive.splitlines())
