"""Baselines the paper compares against that never use the fast weight ops; importing registers them.

feedback_transformer: Fan et al.'s Feedback Transformer LM (softmax attention over a memory of all
layers' past outputs), trained token by token.
"""
from fw_fairseq.baselines import feedback_transformer  # noqa: F401
