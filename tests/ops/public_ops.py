"""Every public op, in each way it can run, as one list shared by the tests that must hold for all of
them (autocast, the dtype rule, an empty batch): several chunks, one chunk, a T = 1 step, with and
without an initial state, fast_weight_attend on both sides of its cost switch (E = 6, M = 5).
The gated rule's alpha is rule_runner.gates_from(beta)."""
from fw_fairseq.ops import fast_weight_attend, fast_weight_read, fast_weight_write
from rule_runner import gates_from, run_rule


def _causal(rule, with_state):
    def call(q, k, v, beta, state):
        return run_rule(rule, "public", q, k, v, beta, state if with_state else None)

    return call


# (id, T, call(q, k, v, beta, state) -> tuple of result tensors)
PUBLIC_OPS = [
    ("sum-chunks-state", 150, _causal("sum", True)),  # three chunks of 50
    ("sum-one-chunk", 20, _causal("sum", False)),
    ("sum-step", 1, _causal("sum", False)),
    ("sum-step-state", 1, _causal("sum", True)),
    ("delta-chunks-state", 100, _causal("delta", True)),  # four chunks of 25
    ("delta-one-chunk", 20, _causal("delta", False)),
    ("delta-step", 1, _causal("delta", False)),
    ("delta-step-state", 1, _causal("delta", True)),
    ("gated-chunks-state", 100, _causal("gated_delta", True)),
    ("gated-one-chunk", 20, _causal("gated_delta", False)),
    ("gated-step", 1, _causal("gated_delta", False)),
    ("gated-step-state", 1, _causal("gated_delta", True)),
    ("write-sum", 20, lambda q, k, v, beta, state: (fast_weight_write(k, v),)),
    ("write-delta", 100, lambda q, k, v, beta, state: (fast_weight_write(k, v, beta),)),
    ("write-gated", 100, lambda q, k, v, beta, state: (fast_weight_write(k, v, beta, gates_from(beta)),)),
    ("read", 20, lambda q, k, v, beta, state: (fast_weight_read(q, state),)),
    ("attend-scores", 4, lambda q, k, v, beta, state: (fast_weight_attend(q, k, v),)),  # (q k^T) v
    ("attend-memory", 40, lambda q, k, v, beta, state: (fast_weight_attend(q, k, v),)),  # q (k^T v)
    ("attend-delta", 20, lambda q, k, v, beta, state: (fast_weight_attend(q, k, v, beta),)),
    ("attend-gated", 20, lambda q, k, v, beta, state: (fast_weight_attend(q, k, v, beta, gates_from(beta)),)),
]
OP_IDS = [case[0] for case in PUBLIC_OPS]
