"""`--criterion fw_unlikelihood` through the real fairseq-train and fairseq-generate: at alpha 0 it trains exactly as
label_smoothed_cross_entropy does, update for update; at alpha 1, with the continuations as candidates, it logs its
term, trains, resumes and generates; a negative alpha or window and an unknown kind of candidates are refused in one
line. Marked slow and e2e (tests/conftest.py)."""
import re

from cli_run import USER_DIR, run, run_refused, train
from test_fairseq_cli import assert_loss_falls, update_losses

FW = ["--fw-feature-map", "dpfp", "--fw-update-rule", "sum", "--fw-decoder-rule", "sum"]
UNLIKELIHOOD = ["--criterion", "fw_unlikelihood"]  # after cli_run.TRAIN's criterion: argparse's last one wins


def test_alpha_0_trains_as_label_smoothed_cross_entropy(data_bin, tmp_path):
    plain = train(data_bin, tmp_path / "plain", FW, "--max-epoch", 1)
    ours = train(data_bin, tmp_path / "ul0", [*FW, *UNLIKELIHOOD, "--unlikelihood-alpha", "0"], "--max-epoch", 1)
    assert update_losses(ours) == update_losses(plain)
    assert len(update_losses(ours)) >= 2


def test_alpha_1_logs_its_term_trains_resumes_and_generates(data_bin, tmp_path):
    flags = [*FW, *UNLIKELIHOOD, "--unlikelihood-alpha", "1", "--unlikelihood-window", "4",
             "--unlikelihood-candidates", "continuations"]
    first = train(data_bin, tmp_path, flags, "--max-epoch", 1)
    resumed = train(data_bin, tmp_path, flags, "--max-epoch", 2)
    assert_loss_falls(first + resumed)
    terms = [float(x) for x in re.findall(r"\| train_inner \|.*?\bul_loss=([^,\s]+)", first + resumed)]
    assert terms and all(term > 0 for term in terms), terms
    assert "Loaded checkpoint" in resumed
    out = run("fairseq-generate", data_bin / "bin", "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
              "--beam", "4", "--batch-size", "8", "--gen-subset", "test", "--required-batch-size-multiple", "1")
    assert len(re.findall(r"^H-\d+\t", out, flags=re.M)) == 20


def test_a_negative_alpha_or_window_or_unknown_candidates_are_refused_in_one_line(data_bin, tmp_path):
    line = train(data_bin, tmp_path, [*FW, *UNLIKELIHOOD, "--unlikelihood-alpha", "-1"], "--max-epoch", 1,
                 tool=run_refused)
    assert line == "fairseq-train: error: --unlikelihood-alpha must be 0 or more, got -1.0"
    line = train(data_bin, tmp_path, [*FW, *UNLIKELIHOOD, "--unlikelihood-window", "-2"], "--max-epoch", 1,
                 tool=run_refused)
    assert line == "fairseq-train: error: --unlikelihood-window must be 0 (every previous token) or more, got -2"
    line = train(data_bin, tmp_path, [*FW, *UNLIKELIHOOD, "--unlikelihood-candidates", "all"], "--max-epoch", 1,
                 tool=run_refused)
    assert line == ("fairseq-train: error: argument --unlikelihood-candidates: invalid choice: 'all' "
                    "(choose from 'previous', 'continuations')")
