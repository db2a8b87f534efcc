"""Loads fw_fairseq into every fairseq command line, `--user-dir fw_fairseq` or not.

fairseq's CLIs compose their configuration through Hydra, and Hydra imports every module of the
`hydra_plugins` namespace package once, before fairseq-generate, fairseq-interactive, fairseq-eval-lm
or a resumed fairseq-train loads a checkpoint. Without this, a checkpoint of a `transformer_fw*` model
read without `--user-dir` fails inside torch.load with an UnpicklingError about weights_only (torch
>= 2.6 refuses the argparse.Namespace that fairseq stores), because nothing registered it or the model.
Other Hydra programs in the same environment are left alone: this only acts where fairseq is loaded.
`--user-dir fw_fairseq` stays the documented way (fairseq imports it first, and this is then a no-op).
"""
import sys

if "fairseq" in sys.modules:
    import fw_fairseq  # noqa: F401  (registers the models, tasks and the checkpoint allow-list)
