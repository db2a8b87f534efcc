"""average_checkpoints.py, wmt_score.py and table1.py on small hand-made inputs."""
import argparse
import json
import random
import subprocess
import sys

import pytest
import torch

from conftest import CORPUS, REPO

from fw_fairseq.models.checkpoints import RECORD, encode
from fw_fairseq.modules.fast_weight_config import FastWeightConfig
from fw_research.wmt14 import average_checkpoints, table1, wmt_score, wmt_text

RESULTS = REPO / "tests" / "scripts" / "fixtures" / "results"  # made-up scores


def _checkpoint(path, scale):
    model = {"encoder.fc.weight": torch.full((2, 3), float(scale)),
             "encoder.half": torch.full((2,), float(scale), dtype=torch.float16),
             "decoder.layers.0.self_attn.favor.projection": torch.full((4, 2), float(scale)),
             "decoder.version": torch.tensor([scale])}
    torch.save({"model": model, "cfg": {"model": argparse.Namespace(arch="transformer_fw_small")},
                "args": argparse.Namespace(arch="transformer_fw_small"),
                "last_optimizer_state": {"state": {0: torch.zeros(3)}}}, path)


def test_average_checkpoints_last_n_epochs(tmp_path):
    for epoch in range(1, 6):
        _checkpoint(tmp_path / f"checkpoint{epoch}.pt", epoch)
    _checkpoint(tmp_path / "checkpoint_best.pt", 100)  # not an epoch checkpoint: ignored
    out = tmp_path / "avg.pt"
    subprocess.run([sys.executable, "-m", "fw_research.wmt14.average_checkpoints", "--inputs", tmp_path,
                    "-n", "3", "--checkpoint-upper-bound", "4", "--output", out], check=True)
    state = torch.load(out, weights_only=False)
    model = state["model"]
    assert torch.equal(model["encoder.fc.weight"], torch.full((2, 3), 3.0))  # mean of epochs 2, 3, 4
    assert model["encoder.half"].dtype == torch.float16 and torch.all(model["encoder.half"] == 3.0)
    # FAVOR+ projections and integer tensors come from the newest epoch (4), not the mean
    assert torch.equal(model["decoder.layers.0.self_attn.favor.projection"], torch.full((4, 2), 4.0))
    assert torch.equal(model["decoder.version"], torch.tensor([4]))
    assert state["args"].arch == "transformer_fw_small" and state["last_optimizer_state"] is None


def test_average_checkpoints_refuses_mismatched_models(tmp_path):
    _checkpoint(tmp_path / "a.pt", 1)
    torch.save({"model": {"other": torch.zeros(1)}}, tmp_path / "b.pt")
    with pytest.raises(ValueError, match="different parameters"):
        average_checkpoints.average([tmp_path / "a.pt", tmp_path / "b.pt"])
    with pytest.raises(ValueError, match="1 epoch checkpoints, 2 requested"):
        _checkpoint(tmp_path / "checkpoint7.pt", 7)
        average_checkpoints.epoch_checkpoints(tmp_path, 2)


def _trained_like(path, feature_map, record=True):
    """A checkpoint as fairseq-train writes it for transformer_fw: its args in cfg.model and, in
    the state dict, the record of its attention settings (absent before the record existed)."""
    args = argparse.Namespace(arch="transformer_fw_small", fw_attention="encoder,decoder,cross",
                              fw_feature_map=feature_map, fw_update_rule="sum", fw_dpfp_nu=1,
                              fw_favor_features=16)
    model = {"encoder.fc.weight": torch.ones(2, 3)}
    if record:
        model[RECORD] = encode(FastWeightConfig.from_args(args).settings())
    torch.save({"model": model, "cfg": {"model": args}, "args": None}, path)


@pytest.mark.parametrize("record", [True, False])
def test_average_checkpoints_refuses_other_attention_settings(tmp_path, record):
    _trained_like(tmp_path / "dpfp.pt", "dpfp", record)
    _trained_like(tmp_path / "elu.pt", "elu", record)
    result = subprocess.run([sys.executable, "-m", "fw_research.wmt14.average_checkpoints", "--inputs",
                             tmp_path / "dpfp.pt", tmp_path / "elu.pt", "--output",
                             tmp_path / "avg.pt"], capture_output=True, text=True)
    assert result.returncode != 0 and not (tmp_path / "avg.pt").exists()
    assert result.stderr.strip().splitlines()[-1] == (f"average_checkpoints: {tmp_path / 'elu.pt'} was trained "
                                     f"with --fw-feature-map elu, {tmp_path / 'dpfp.pt'} with "
                                     f"--fw-feature-map dpfp")


def test_compound_split_like_the_published_script():
    assert wmt_score.compound_split("Nord @-@ Süd-Dialog a-b-c") == \
        "Nord @ ##AT##-##AT## @ Süd ##AT##-##AT## Dialog a ##AT##-##AT## b-c"


def test_score_of_the_reference_itself_is_100(tmp_path):
    """Hypotheses = tokenised references, printed out of order as fairseq-generate does."""
    refs = (CORPUS / "newstest2014.de").read_text().splitlines()
    tok = wmt_text.tokenise_lines(refs, "de", train=False)
    order = list(range(len(tok)))
    random.Random(0).shuffle(order)
    gen = tmp_path / "gen.txt"
    gen.write_text("".join(f"S-{i}\tsrc\nH-{i}\t-0.5\t{tok[i]}\nD-{i}\t-0.5\tx\n" for i in order))
    (tmp_path / "ref").write_text("\n".join(refs) + "\n")
    (tmp_path / "tok").write_text("\n".join(tok) + "\n")
    args = ["--gen", gen, "--ref", tmp_path / "ref", "--tok-ref", tmp_path / "tok", "--hyp-out", tmp_path / "hyp",
            "--out", tmp_path / "r.json", "--config", "c", "--subset", "test", "--checkpoint", "x.pt"]
    wmt_score.main([str(a) for a in args])
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["tok_bleu"] == 100.0 and result["sacrebleu"] == 100.0
    # detokenisation restores the original text (sacrebleu scores what people read)
    assert (tmp_path / "hyp").read_text().splitlines() == refs

    gen.write_text("".join(f"H-{i}\t-0.5\t{tok[i]}\n" for i in order[:-1]))  # one sentence missing
    with pytest.raises(SystemExit, match="generation incomplete"):
        wmt_score.main([str(a) for a in args])


def test_table1_from_result_files():
    table = table1.render(table1.read_configs(REPO / "configs" / "wmt14_en_de"),
                          table1.read_results(RESULTS, "checkpoint_best.pt"), "sacrebleu")
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Model")}
    assert list(rows) == ["Standard", "Linear", "Performer", "DPFP", "DPFP + delta (beyond the paper)",
                          "DPFP + delta, softmax cross-attention (beyond the paper)",
                          "DPFP + delta, aligned cross-attention, unlikelihood (beyond the paper)"]
    # columns: valid 64/256/512, test 64/256/512; cells "ours (paper)"
    assert rows["Standard"] == ["26.1 (26.6)", "", "", "27.2 (27.7)", "", ""]  # not the averaged 28.4
    assert rows["Performer"] == ["– (24.2)", "– (24.9)", "– (26.7)", "– (24.4)", "25.6 (25.3)", "– (27.7)"]
    assert rows["DPFP"] == ["", "25.9 (26.2)", "– (26.2)", "", "26.7 (26.9)", "– (27.1)"]
    assert rows["DPFP + delta (beyond the paper)"] == ["", "– (–)", "– (–)", "", "– (–)", "27.0 (–)"]
    assert rows["DPFP + delta, softmax cross-attention (beyond the paper)"] == ["", "– (–)", "", "", "– (–)", ""]
    aligned = "DPFP + delta, aligned cross-attention, unlikelihood (beyond the paper)"
    assert rows[aligned] == ["", "– (–)", "", "", "– (–)", ""]
    assert ("No results yet for: dpfp_nu2_delta, dpfp_nu2_delta_align4, dpfp_nu2_delta_softcross, dpfp_nu4, "
            "performer_m256, performer_m32" in table)
    assert "sacreBLEU signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0" in table


def test_table1_cli_tokenised_bleu_and_other_checkpoints(tmp_path):
    out = tmp_path / "t.md"
    subprocess.run([sys.executable, "-m", "fw_research.wmt14.table1", "--results", RESULTS, "--metric", "tok_bleu",
                    "--checkpoint", "avg_last5.pt", "--output", out], check=True)
    text = out.read_text()
    assert "| Standard | – (26.6) |  |  | 29.0 (27.7) |" in text and "tokenised BLEU" in text


def test_average_checkpoints_reads_an_older_record_at_the_values_it_implies(tmp_path):
    """A delta-rule record written before --fw-delta-beta-max existed means beta max 1: averaging it with
    a beta-max-2 checkpoint is refused like any other difference."""
    args = argparse.Namespace(arch="transformer_fw_small", fw_attention="encoder,decoder,cross",
                              fw_feature_map="dpfp", fw_update_rule="delta", fw_dpfp_nu=1,
                              fw_favor_features=16, fw_delta_beta_max=2)
    new = FastWeightConfig.from_args(args).settings()
    old = {flag: value for flag, value in new.items() if flag != "--fw-delta-beta-max"}
    for name, settings in (("new.pt", new), ("old.pt", old)):
        torch.save({"model": {"encoder.fc.weight": torch.ones(2, 3), RECORD: encode(settings)},
                    "cfg": {"model": args}, "args": None}, tmp_path / name)
    with pytest.raises(ValueError, match="old.pt was trained with --fw-delta-beta-max 1, .*new.pt with "
                                         "--fw-delta-beta-max 2"):
        average_checkpoints.average([tmp_path / "new.pt", tmp_path / "old.pt"])
