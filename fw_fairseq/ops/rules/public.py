"""The public fast weight ops on feature-mapped inputs: the causal rules, the non-causal memory and its read.

Shapes, head-first: q, k [B, H, T, E] (already feature-mapped); v [B, H, T, M]; beta, alpha [B, H, T];
state [B, H, E, M]. alpha (the gated rule's decay) must lie in (0, 1]; its values are not checked (that would
synchronise a GPU at every call). No scaling or normalisation happens in the ops: the caller normalises phi
(`normalised_phi`: sum or L2, PHI_NORMS) or divides by the z column (`divide_by_z`), as the rule's record says.
dtypes and autocast: dispatch.py's docstring (the one dtype rule of common/guards.py).
"""
from fw_fairseq.ops.common.guards import autocast_off
from fw_fairseq.ops.fused_read.available import kernels
from fw_fairseq.ops.fused_read.dispatch import read
from fw_fairseq.ops.rules.delta.record import DELTA, GATED_DELTA
from fw_fairseq.ops.rules.dispatch import attend, causal, memory
from fw_fairseq.ops.rules.registry import RULES, rule_with
from fw_fairseq.ops.rules.sum.record import SUM


@autocast_off
def fast_weight_sum(q, k, v, initial_state=None, output_final_state=False):
    """Causal sum rule: W_t = W_{t-1} + k_t v_t^T; o_t = W_t^T q_t. Returns (o [B,H,T,M], state or None)."""
    return causal(SUM, "fast_weight_sum", q, k, v, {}, initial_state, output_final_state)


@autocast_off
def fast_weight_delta(q, k, v, beta, initial_state=None, output_final_state=False):
    """Causal delta rule: W_t = W_{t-1} + beta_t k_t (v_t - W_{t-1}^T k_t)^T; o_t = W_t^T q_t.

    Returns (o [B, H, T, M], state [B, H, E, M] or None).
    """
    return causal(DELTA, "fast_weight_delta", q, k, v, {"beta": beta}, initial_state, output_final_state)


@autocast_off
def fast_weight_gated_delta(q, k, v, beta, alpha, initial_state=None, output_final_state=False):
    """Causal gated delta rule (Gated DeltaNet, Yang et al. 2024), alpha [B, H, T] in (0, 1]:
    W_t = alpha_t W_{t-1} + beta_t k_t (v_t - alpha_t W_{t-1}^T k_t)^T; o_t = W_t^T q_t.
    alpha = 1 is fast_weight_delta. Returns (o [B, H, T, M], state [B, H, E, M] or None).
    """
    return causal(GATED_DELTA, "fast_weight_gated_delta", q, k, v, {"beta": beta, "alpha": alpha},
                  initial_state, output_final_state)


@autocast_off
def fast_weight_write(k, v, beta=None, alpha=None):
    """Non-causal memory of all T positions: sum_t k_t v_t^T (no beta), or the state after the delta writes
    t = 1..T in order (the causal delta rule's final state; gated by alpha [B, H, T] if given).
    Returns state [B, H, E, M]. Any registered rule: UpdateRule.write."""
    rule, scalars = rule_with("fast_weight_write", {"beta": beta, "alpha": alpha})
    return memory(rule, "fast_weight_write", k, v, scalars)


@autocast_off
def fast_weight_attend(q, k, v, beta=None, alpha=None):
    """Non-causal attention through fast weights: fast_weight_read(q, fast_weight_write(k, v, beta, alpha)), in
    the cheaper order for short sequences (dispatch.attend). q [B, H, Tq, E], k [B, H, T, E], v [B, H, T, M],
    beta, alpha [B, H, T] or None -> o [B, H, Tq, M]. Any registered rule: UpdateRule.attend."""
    rule, scalars = rule_with("fast_weight_attend", {"beta": beta, "alpha": alpha})
    return attend(rule, "fast_weight_attend", q, k, v, scalars)


def fused_read(phi, rule, q, k, v, scalars, causal, norm=None, key_padding_mask=None):
    """The fused GPU read (fw_fairseq/ops/fused_read): o [B, H, Tq, M] from the raw heads q [B, H, Tq, d], k [B, H, T, d],
    v [B, H, T, M], phi a FeatureMap with a row form, rule a RULES name, scalars its [B, H, T] tensors. Raises ValueError, one line naming the argument, on
    what it cannot take: shapes, dtypes, devices, T beyond launch.MAX_T, a map without a row form, a rule without a
    fused form."""
    if not kernels():
        raise ValueError("fused_read: Triton is not available on this machine")
    if rule not in RULES or RULES[rule].fused is None:
        raise ValueError(f"fused_read: rule={rule!r} has no fused form; allowed: "
                         f"{', '.join(name for name, r in RULES.items() if r.fused is not None)}")
    launch = kernels()
    spec = launch.map_spec(phi)
    if spec is None:
        raise ValueError(f"fused_read: phi={type(phi).__name__} has no row form; allowed: DPFP, ELU+1, Hedgehog, FAVOR+")
    if spec.E > launch.MAX_E:
        raise ValueError(f"fused_read: phi is {spec.E} wide; the fused read takes E <= {launch.MAX_E}")
    if not isinstance(scalars, (tuple, list)) or len(scalars) != len(RULES[rule].scalars):
        raise ValueError(f"fused_read: scalars must be a tuple of {len(RULES[rule].scalars)} [B, H, T] tensors "
                         f"{RULES[rule].scalars} for rule {rule}")
    return read(spec, RULES[rule], q, k, v, tuple(scalars), causal, norm, key_padding_mask)
