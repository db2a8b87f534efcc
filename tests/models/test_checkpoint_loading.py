"""fairseq checkpoints load under torch >= 2.6 (weights_only=True) once the plugin is imported."""
import argparse

import numpy as np
import torch
from fairseq import checkpoint_utils

import fw_fairseq  # noqa: F401


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
