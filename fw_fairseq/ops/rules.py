"""The update rules, one record each (UpdateRule), and their public ops: the one table that the
attention module, the synthetic task and the dispatch (fast_weight.py) read.

A record says, for its rule: the public causal op and the non-causal write (memory) op, the T = 1
form and the chunked form the causal op takes off the kernel path, the CUDA wrapper and kernel name, the
fused GPU read and the CPU kernels' short read from raw heads, which per-position scalars it reads ([B, H, T], in its ops' argument order) and their values at padded
positions, whether φ is normalised, and whether it carries the z column. Adding a rule is one
record and one public op here, its maths (naive.py, chunked forms, step.py) and its kernel.

Shapes, head-first: q, k [B, H, T, E] (already feature-mapped); v [B, H, T, M]; beta, alpha [B, H, T];
state [B, H, E, M]. alpha (the gated rule's decay) must lie in (0, 1]; its values are not checked
(that would synchronise a GPU at every call). No scaling or normalisation happens in the ops: the
caller normalises φ (`normalised_phi`: sum or L2, PHI_NORMS) or divides by the z column (`divide_by_z`).
dtypes and autocast: fast_weight.py's docstring (the one dtype rule of guards.py).
"""
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

import torch

from .attend_function import attend_short
from .chunked import chunked_delta, chunked_gated_delta, chunked_sum
from .cuda_functions import cuda_delta, cuda_gated_delta, cuda_sum
from .effective_writes import effective_writes
from .feature_attend import delta_short_read, sum_short_read
from .fused_read.forms import delta_rule_read, sum_rule_read
from .fast_weight import _check_causal, _check_tensor, causal, fast_weight_read, memory
from .guards import autocast_off, records, state_dtype
from .read_order import short_order
from .step import step_delta, step_gated_delta, step_sum


@dataclass(frozen=True)
class UpdateRule:
    name: str
    causal: Callable  # (q, k, v, *scalars, initial_state=None, output_final_state=False) -> (o, state or None)
    write: Callable  # (k, v, *scalars) -> the memory of all T positions [B, H, E, M] (non-causal)
    step: Callable  # the causal op's T = 1 form off the kernel path (step.py), same arguments as causal
    chunked: Callable  # its T > 1 form off the kernel path (chunked.py)
    memory: Callable  # the write's form off the kernel path, (k, v, *scalars) -> state
    cuda: Callable  # (ext, q, k, v, *scalars, state0) -> (o, final state): the kernel's autograd wrapper
    kernel: str  # the extension's {kernel}_forward / _backward / _step
    kernel_memory: bool  # whether the write runs the causal kernel on CUDA (else `memory` is faster)
    scalars: Tuple[str, ...]  # per-position scalar inputs [B, H, T], in the ops' argument order
    pad_values: Mapping[str, float]  # each scalar at a padded position: it must write and decay nothing
    normalised_phi: bool  # phi of keys and queries normalised (PHI_NORMS): keeps the delta write contractive
    z_column: bool  # values carry a ones column: the state's last column is z = sum phi(k) (divide_by_z)
    fused: Optional[Callable]  # its fused GPU read from raw heads (fused_read/forms.py), None where it has none
    short: Optional[Callable]  # its short read from raw heads on the CPU kernels (feature_attend.py), or None


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


def _rule_of(fn, beta, alpha):
    """The rule whose scalars were given, and those scalars: none (sum), beta (delta), beta and alpha."""
    if beta is None and alpha is not None:
        raise ValueError(f"{fn}: alpha (the gated delta rule's decay) needs beta")
    scalars = {name: x for name, x in (("beta", beta), ("alpha", alpha)) if x is not None}
    return next(rule for rule in RULES.values() if rule.scalars == tuple(scalars)), scalars


@autocast_off
def fast_weight_write(k, v, beta=None, alpha=None):
    """Non-causal memory of all T positions: sum_t k_t v_t^T (beta None), or the state after the delta
    writes t = 1..T in order (the causal delta rule's final state; gated by alpha [B, H, T] if given).
    Returns state [B, H, E, M]."""
    rule, scalars = _rule_of("fast_weight_write", beta, alpha)
    return memory(rule, "fast_weight_write", k, v, scalars)


@autocast_off
def fast_weight_attend(q, k, v, beta=None, alpha=None):
    """Non-causal attention through fast weights: fast_weight_read(q, fast_weight_write(k, v, beta, alpha)).

    Same function, cheaper order where it exists: when Tq*T*(E+M) is below (Tq+T)*E*M (short
    sentences: T < E, M), o = (q k^T) U never forms the [E, M] memory, with U the rule's effective
    writes (effective_writes.py: V for the sum rule). The delta rules take it only where autograd records
    nothing (generation, validation); with autograd their memory has the chunked form's hand-written
    backward. q [B, H, Tq, E], k [B, H, T, E], v [B, H, T, M], beta, alpha [B, H, T] or None -> o [B, H, Tq, M].
    """
    rule, scalars = _rule_of("fast_weight_attend", beta, alpha)
    _, k, v, scalar_list, _ = _check_causal("fast_weight_attend", k, k, v, scalars, None, names=("k", "k", "v"))
    _check_tensor("fast_weight_attend", "q", q, 4, "[B, H, Tq, E]")
    if q.shape[:2] != k.shape[:2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"fast_weight_attend: q has shape {tuple(q.shape)}, expected "
                         f"[B, H, Tq, E] with B, H, E of k's {tuple(k.shape)}")
    # one dtype for q and the memory, so that both orders compute in the same precision
    dtype = torch.promote_types(q.dtype, k.dtype)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    scalars = {name: x.to(dtype) for name, x in zip(scalars, scalar_list)}
    Tq, (T, E), M = q.shape[2], k.shape[2:], v.shape[-1]
    if short_order(Tq, T, E, M) and (rule is SUM or not records(q, k, v, *scalar_list)):
        dtype = state_dtype(dtype)
        k = k.to(dtype)
        return attend_short(q.to(dtype), k, effective_writes(k, v.to(dtype), *(x.to(dtype) for x in scalar_list)))
    return fast_weight_read(q, memory(rule, "fast_weight_attend", k, v, scalars))


def _sum_memory(k, v):
    """sum_t k_t^T v_t, one einsum in the state dtype: k [B, H, T, E], v [B, H, T, M] -> [B, H, E, M]."""
    dtype = state_dtype(k.dtype)
    return torch.einsum("bhte,bhtm->bhem", k.to(dtype), v.to(dtype))


def _delta_memory(k, v, beta, alpha=None):
    """The (gated) delta rule's final state without reading (no queries): [B, H, E, M]."""
    return chunked_gated_delta(None, k, v, beta, alpha, None, output_final_state=True)[1]


SUM = UpdateRule(
    name="sum", causal=fast_weight_sum, write=fast_weight_write, step=step_sum, chunked=chunked_sum,
    memory=_sum_memory, cuda=cuda_sum, kernel="sum", kernel_memory=False, scalars=(), pad_values={},
    normalised_phi=False, z_column=True, fused=sum_rule_read, short=sum_short_read,
)
DELTA = UpdateRule(
    name="delta", causal=fast_weight_delta, write=fast_weight_write, step=step_delta, chunked=chunked_delta,
    memory=_delta_memory, cuda=cuda_delta, kernel="delta", kernel_memory=True, scalars=("beta",),
    pad_values={"beta": 0.0}, normalised_phi=True, z_column=False, fused=delta_rule_read,
    short=delta_short_read,
)
GATED_DELTA = UpdateRule(
    name="gated_delta", causal=fast_weight_gated_delta, write=fast_weight_write, step=step_gated_delta,
    chunked=chunked_gated_delta, memory=_delta_memory, cuda=cuda_gated_delta, kernel="gated_delta",
    kernel_memory=True, scalars=("beta", "alpha"), pad_values={"beta": 0.0, "alpha": 1.0},
    normalised_phi=True, z_column=False, fused=delta_rule_read, short=None,
)
RULES = {rule.name: rule for rule in (SUM, DELTA, GATED_DELTA)}
