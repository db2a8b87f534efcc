"""fw_fairseq: fast weight programmers as a fairseq plugin.

`fairseq-train --user-dir fw_fairseq --arch transformer_fw_big ...` imports this package, which
registers the `transformer_fw` model and its architectures with fairseq. The package itself imports
no fairseq: where fairseq is loaded already (its CLIs, a checkpoint being read) the models, tasks,
baselines and criterions are registered at once, and otherwise when fairseq is first imported, so
that the ops (fw_fairseq.ops) load without fairseq and a later `import fairseq` still finds the models.
"""
import argparse
import sys

import torch

from fw_fairseq._registration import RegisterWithFairseq, register


def _allow_fairseq_checkpoints():
    """Let torch >= 2.6 (weights_only=True by default) load fairseq checkpoints.

    fairseq stores the training arguments as an `argparse.Namespace` inside every checkpoint;
    without this, `fairseq-generate --path`, `fairseq-interactive` and resuming from
    `checkpoint_last.pt` fail with "Unsupported global: argparse.Namespace".
    """
    add_safe_globals = getattr(torch.serialization, "add_safe_globals", None)
    if add_safe_globals is None:  # torch < 2.4 loads fairseq checkpoints as they are
        return
    add_safe_globals([argparse.Namespace, *_numpy_globals()])


def _numpy_globals():
    """What numpy arrays pickle as: with --eval-bleu, fairseq stores the BLEU n-gram counts as
    numpy arrays in every checkpoint's extra_state (so resume and generate need these too)."""
    import numpy as np

    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    dtype_classes = {type(np.dtype(t)) for t in np.typecodes["All"] if t not in "OSUVcMm"}
    return [multiarray._reconstruct, multiarray.scalar, np.ndarray, np.dtype, *dtype_classes]


_allow_fairseq_checkpoints()

if "fairseq" in sys.modules:
    register()
else:
    sys.meta_path.insert(0, RegisterWithFairseq())
