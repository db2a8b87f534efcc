"""Synthetic associative retrieval (paper §6.1) on the plugin's own fast weight ops.

data:   sequence generator for setting 1 (capacity) and setting 2 (update rules)
models: RetrievalMemory (softmax / sum / delta / gated delta / Schlag 2021 memories)
train:  Adam training with the paper's stopping rule and the all-queries evaluation
Nothing here imports fairseq.
"""
from .data import evaluation_batch, latest_values, retrieval_loss, sample_sequences, training_batch
from .models import RetrievalMemory, schlag_write
from .train import TrainConfig, evaluate, train

__all__ = [
    "sample_sequences",
    "latest_values",
    "training_batch",
    "evaluation_batch",
    "retrieval_loss",
    "RetrievalMemory",
    "schlag_write",
    "TrainConfig",
    "evaluate",
    "train",
]
