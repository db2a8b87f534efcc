"""One way to call every implementation of the causal rules, shared by the ops tests (and the gates
they draw: `make_alpha`; the comparison of a read and its gradients with its reference: `assert_read_matches`).
Helpers live here, not in conftest.py: a plain `from conftest import` would find another directory's conftest
when the whole suite runs."""
import torch

from fw_fairseq.ops import RULES, fast_weight_delta, fast_weight_gated_delta, fast_weight_sum
from fw_fairseq.ops.rules.delta.chunked import chunked_delta, chunked_gated_delta
from fw_fairseq.ops.rules.sum.chunked import chunked_sum
from fw_fairseq.ops.rules.delta.naive import naive_delta, naive_gated_delta
from fw_fairseq.ops.rules.reference import naive_noncausal
from fw_fairseq.ops.rules.registry import rule_with
from fw_fairseq.ops.rules.sum.naive import naive_sum

RULE_FNS = {
    "sum": {"naive": naive_sum, "chunked": chunked_sum, "public": fast_weight_sum},
    "delta": {"naive": naive_delta, "chunked": chunked_delta, "public": fast_weight_delta},
    "gated_delta": {"naive": naive_gated_delta, "chunked": chunked_gated_delta, "public": fast_weight_gated_delta},
}
SCALARS = {name: rule.scalars for name, rule in RULES.items()}  # per-position inputs, in argument order


def make_alpha(B=2, H=3, T=37, low=0.3, dtype=torch.float64, seed=1, requires_grad=False):
    """The gated rule's decay alpha [B, H, T], uniform in [low, 1)."""
    g = torch.Generator().manual_seed(seed)
    alpha = low + (1 - low) * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    return alpha.to(dtype).requires_grad_(requires_grad)


def gates_from(beta):
    """A decay alpha in [0.5, 1) [B, H, T] for the tests that draw only beta: a function of beta, so
    that it shares beta's dtype, shape and autograd leaf."""
    return 1 - 0.5 * beta


def run_rule(rule, impl, q, k, v, beta, state, chunk=64, alpha=None):
    """(o, final_state) of one implementation of `rule` (sum / delta / gated_delta); impl in naive /
    chunked / public. chunk is the chunked path's chunk size; the sum rule ignores beta, the gated
    rule takes alpha (gates_from(beta) if not given)."""
    fn = RULE_FNS[rule][impl]
    kwargs = {"chunk_size": chunk} if impl == "chunked" else {}
    scalars = {"beta": beta, "alpha": gates_from(beta) if alpha is None else alpha}
    return fn(q, k, v, *(scalars[name] for name in SCALARS[rule]), state, True, **kwargs)


def noncausal_reference(q, k, v, beta=None, alpha=None):
    """The reference non-causal read (reference.naive_noncausal) of the rule that takes the given scalars: the sum
    rule without beta, the delta rule with beta, the gated rule with beta and alpha."""
    rule, scalars = rule_with("noncausal_reference", {"beta": beta, "alpha": alpha})
    return naive_noncausal(rule, q, k, v, *scalars.values())


def assert_read_matches(ours, ref, leaves, tol, grad_tol):
    """ours close to ref (tol), and their gradients towards `leaves` for one random upstream gradient (grad_tol)."""
    torch.testing.assert_close(ours, ref, **tol)
    upstream = torch.randn_like(ref)
    for g_ours, g_ref in zip(torch.autograd.grad(ours, leaves, upstream), torch.autograd.grad(ref, leaves, upstream),
                             strict=True):
        torch.testing.assert_close(g_ours, g_ref, **grad_tol)
