"""fairseq checkpoints load under torch >= 2.6 (weights_only=True) once the plugin is imported,
and carry the record of the attention settings they were trained with."""
import argparse
import logging

import numpy as np
import torch
from fairseq import checkpoint_utils

import fw_fairseq  # noqa: F401
from fw_fairseq.models.checkpoints import RECORD, decode


def test_fairseq_loader_reads_namespace_and_numpy_metrics(tmp_path):
    path = tmp_path / "checkpoint_last.pt"
    # what fairseq-train writes with --eval-bleu: args as a Namespace, BLEU counts as numpy
    torch.save({"args": None, "cfg": {"model": argparse.Namespace(arch="transformer_fw")},
                "model": {"w": torch.ones(2)},
                "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion",
                                       "optimizer_name": "Adam", "lr_scheduler_state": {},
                                       "num_updates": 3}],
                "extra_state": {"metrics": {"valid": [("_bleu_counts", np.array([3, 2, 1, 0])),
                                                      ("_bleu_sys_len", np.int64(7)),
                                                      ("loss", np.float64(1.5))]}}}, path)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(path))
    assert state["cfg"]["model"].arch == "transformer_fw"
    metrics = dict(state["extra_state"]["metrics"]["valid"])
    assert metrics["_bleu_counts"].tolist() == [3, 2, 1, 0] and metrics["loss"] == 1.5


def test_state_dict_records_what_the_attention_computes():
    from fw_model_factory import build_model

    model, _ = build_model(["--fw-feature-map", "favor", "--fw-update-rule", "delta",
                            "--fw-favor-features", "8", "--fw-dpfp-nu", "3"])
    assert decode(model.state_dict()[RECORD]) == {
        "--fw-attention": "encoder,decoder,cross", "--fw-feature-map": "favor",
        "--fw-update-rule": "delta", "--fw-favor-features": "8"}  # nu does not apply to favor
    softmax, _ = build_model(["--fw-attention", "none", "--fw-feature-map", "elu"])
    assert decode(softmax.state_dict()[RECORD]) == {"--fw-attention": "none"}


def test_checkpoint_from_before_the_record_loads_with_one_warning(caplog):
    from fw_model_factory import build_model

    old, _ = build_model(["--fw-feature-map", "elu"], seed=1)
    state = old.state_dict()
    del state[RECORD]
    model, _ = build_model(["--fw-feature-map", "elu"], seed=2)
    with caplog.at_level(logging.WARNING):
        model.load_state_dict(state)
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "the checkpoint predates the record of its --fw-* settings; they cannot be checked: "
        "load it with the flags it was trained with"]
    assert torch.equal(model.encoder.layers[0].self_attn.q_proj.weight,
                       old.encoder.layers[0].self_attn.q_proj.weight)

