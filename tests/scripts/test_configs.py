"""Every Table 1 config, on top of the shared recipe, parses with fairseq and builds the model
it claims (with the tiny architecture, so that this stays fast)."""
import subprocess

import pytest
from fairseq import options, tasks

from conftest import REPO
from fw_fairseq.modules.fast_weight_attention import FastWeightAttention

CONFIGS = sorted(p.stem for p in (REPO / "configs" / "wmt14_en_de").glob("*.sh") if p.stem != "common")
TINY = ["--arch", "transformer_fw_small", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-embed-dim", "64", "--decoder-embed-dim", "64", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2"]
# d_key = 64 in the paper: the config's d_dot column follows from its flags (Table 6)
D_DOT = {"elu": lambda a: 64, "favor": lambda a: 2 * a.fw_favor_features, "dpfp": lambda a: 2 * 64 * a.fw_dpfp_nu}


def recipe(name):
    """TRAIN_ARGS + CRITERION_ARGS + FW_ARGS as train.sh assembles them, and the config's Table 1 cell."""
    script = (f'source configs/wmt14_en_de/common.sh; source configs/wmt14_en_de/{name}.sh; '
              f'printf "%s\\0" "$TABLE1_ROW" "$TABLE1_DDOT" "${{TRAIN_ARGS[@]}}" "${{CRITERION_ARGS[@]}}" '
              f'"${{FW_ARGS[@]}}"')
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True).stdout
    row, ddot, *args = out.split("\0")[:-1]
    return row, int(ddot), args


def test_all_table1_cells_have_a_config():
    cells = {recipe(name)[:2] for name in CONFIGS}
    assert cells >= {("Standard", 64), ("Linear", 64), ("Performer", 64), ("Performer", 256),
                     ("Performer", 512), ("DPFP", 256), ("DPFP", 512), ("DPFP + delta", 256), ("DPFP + delta", 512),
                     ("DPFP + delta, softmax cross-attention", 256),
                     ("DPFP + delta, aligned cross-attention, unlikelihood", 256)}


@pytest.mark.parametrize("name", CONFIGS)
def test_config_builds_its_model(name, prepared):
    work, _ = prepared
    row, ddot, args = recipe(name)
    parser = options.get_training_parser()
    parsed = options.parse_args_and_arch(
        parser, [str(work / "data-bin" / "bpe300"), "--user-dir", str(REPO / "fw_fairseq"), *args, *TINY])
    assert parsed.arch == "transformer_fw_small" and parsed.max_epoch == 45 and parsed.eval_bleu
    model = tasks.setup_task(parsed).build_model(parsed)
    fast = [m for m in model.modules() if isinstance(m, FastWeightAttention)]
    if row == "Standard":
        assert not fast
        return
    assert D_DOT[parsed.fw_feature_map](parsed) == ddot
    # the delta configs: delta in the decoder's self-attention (causal), the sum rule over the source; with softmax
    # cross-attention the 1+1 layers have two fast-weight blocks instead of three
    decoder = "delta" if "delta" in row else "sum"
    rules = {"encoder": "sum", "causal": decoder} | ({} if "softmax cross" in row else {"cross": "sum"})
    assert len(fast) == len(rules) and {m.path: m.update_rule for m in fast} == rules
