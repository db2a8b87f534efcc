"""One way to call every implementation of the causal rules, shared by the ops tests."""
from fw_fairseq.ops import fast_weight_delta, fast_weight_sum
from fw_fairseq.ops.chunked import chunked_delta, chunked_sum
from fw_fairseq.ops.naive import naive_delta, naive_sum


def run_rule(rule, impl, q, k, v, beta, state, chunk=64):
    """(o, final_state) of one implementation of `rule` (sum / delta); impl in naive / chunked / public.
    chunk is the chunked path's chunk size; beta is ignored by the sum rule."""
    if rule == "sum":
        fn = {"naive": naive_sum, "chunked": lambda *a: chunked_sum(*a, chunk_size=chunk), "public": fast_weight_sum}
        return fn[impl](q, k, v, state, True)
    fn = {"naive": naive_delta, "chunked": lambda *a: chunked_delta(*a, chunk_size=chunk), "public": fast_weight_delta}
    return fn[impl](q, k, v, beta, state, True)
