"""The engine under the public fast weight ops (public.py) and the rules' records: input validation and
the one dispatch point (CUDA kernel or chunked PyTorch) of the causal op, the memory and the non-causal read
of any rule (rules/record.py), plus fast_weight_read.

Shapes, head-first: q, k [B, H, T, E] (already feature-mapped); v [B, H, T, M]; per-position scalars
(beta, alpha) [B, H, T]; state [B, H, E, M] (keys x values). No scaling or normalisation happens here
(rules/record.py: the caller sum-normalises phi or divides by the z column, as the rule's record says).

dtypes: any float dtype. Mixed inputs (e.g. float32 FAVOR+ features with fp16 values) are promoted
to their common dtype. Outputs and states are float32 for fp16/bf16 and in the input dtype for
float32/float64 (guards.state_dtype; half-precision outputs would overflow: the sum rule's
unnormalised numerator and z column grow with the sequence); a given initial_state is cast to it.
The ops run with autocast off (guards.autocast_off), so under autocast they return what they return
without it for the same input dtypes; cast the output back to the activations' dtype yourself.
"""
import torch

from fw_fairseq.ops.kernels import cuda_extension  # through the module: a test stands in for the extension in one place
from fw_fairseq.ops.kernels.cuda_ops import apply_kernel
from fw_fairseq.ops.common.attend_function import attend_short
from fw_fairseq.ops.common.checks import check_tensor
from fw_fairseq.ops.common.guards import autocast_off, records, state_dtype
from fw_fairseq.ops.common.positions import position_weight, with_positions
from fw_fairseq.ops.common.read_order import short_order


def causal(rule, fn, q, k, v, scalars, initial_state=None, output_final_state=False):
    """The causal rule `rule` (a rules.record.UpdateRule) over q, k, v and its per-position scalars
    ({name: [B, H, T]} in rule.scalars' order), on the rule's CUDA kernel or off it: its step form for
    T = 1 (where it has one), its chunked form otherwise. fn names the caller in error messages.
    Returns (o [B, H, T, M], state [B, H, E, M] or None)."""
    q, k, v, scalars, state0 = _check_causal(fn, q, k, v, scalars, initial_state)
    ext = cuda_extension.cuda_kernel(q, v, rule.kernel) if rule.kernel else None
    if ext is None:  # a decoding step (T = 1) skips the chunk machinery
        form = rule.step if q.shape[2] == 1 and rule.step else rule.form("chunked")
        return form(q, k, v, *scalars, state0, output_final_state)
    o, state = apply_kernel(rule, ext, q, k, v, *scalars, _kernel_state(q, k, v, state0))
    return o, (state if output_final_state else None)


def memory(rule, fn, k, v, scalars):
    """The non-causal memory of all T positions under `rule`: its causal state after writing t = 1..T.
    On CUDA the rule's kernel computes it where rule.kernel_memory says it is the faster way.
    Returns state [B, H, E, M]."""
    _, k, v, scalars, _ = _check_causal(fn, k, k, v, scalars, None, names=("k", "k", "v"))
    ext = cuda_extension.cuda_kernel(k, v, rule.kernel) if rule.kernel_memory else None
    if ext is None:
        return rule.form("memory")(k, v, *scalars)
    # the kernel always reads; reading with q = k is the cheapest valid query
    return apply_kernel(rule, ext, k, k, v, *scalars, _kernel_state(k, k, v, None))[1]


def attend(rule, fn, q, k, v, scalars, positions=None):
    """Non-causal attention through fast weights under `rule`: fast_weight_read(q, memory(k, v, scalars)).

    Same function, cheaper order where it exists: when Tq*T*(E+M) is below (Tq+T)*E*M (short sentences:
    T < E, M), o = (q k^T) U never forms the [E, M] memory, with U the rule's effective writes (rule.writes).
    A rule takes it where autograd records nothing (generation, validation), and also with autograd where
    rule.short_with_grad (the sum rule, whose U is V; the delta rules' memory has the chunked form's
    hand-written backward). q [B, H, Tq, E], k [B, H, T, E], v [B, H, T, M], scalars {name: [B, H, T]}
    -> o [B, H, Tq, M].

    positions: None, or the positional factors (of q [B, Tq, R], of k [B, T, R], or per head [B, H, Tq, R] and
    [B, H, T, R]) of a kernel that carries the positions (ops/common/positions.py): the memory order writes and
    reads features R times wider; the short order weighs its scores by them, and hands the rule the wide keys only
    where its writes read the memory at their key (rule.key_reads)."""
    _, k, v, scalar_list, _ = _check_causal(fn, k, k, v, scalars, None, names=("k", "k", "v"))
    check_tensor(fn, "q", q, "[B, H, Tq, E]", sizes=(*k.shape[:2], None, k.shape[-1]))
    # one dtype for q and the memory, so that both orders compute in the same precision
    dtype = torch.promote_types(q.dtype, k.dtype)
    q, k, v = (x.to(dtype) for x in (q, k, v))
    scalar_list = [x.to(dtype) for x in scalar_list]
    Tq, (T, E), M = q.shape[2], k.shape[2:], v.shape[-1]
    R = 1 if positions is None else positions[0].size(-1)
    if (rule.writes is not None and short_order(Tq, T, E, M, R)
            and (rule.short_with_grad or not records(q, k, v, *scalar_list))):
        dtype = state_dtype(dtype)
        q, k, v = (x.to(dtype) for x in (q, k, v))
        scalar_list = [x.to(dtype) for x in scalar_list]
        if positions is None:
            return attend_short(q, k, rule.writes(k, v, *scalar_list))
        writing = with_positions(k, positions[1]) if rule.key_reads else k
        u = rule.writes(writing, v, *scalar_list)
        return attend_short(q, k, u, position_weight(*(x.to(dtype) for x in positions)))
    if positions is not None:
        q, k = with_positions(q, positions[0]), with_positions(k, positions[1])
    return fast_weight_read(q, memory(rule, fn, k, v, dict(zip(scalars, scalar_list))))


@autocast_off
def fast_weight_read(q, state):
    """o = q @ state: q [B, H, Tq, E], state [B, H, E, M] -> o [B, H, Tq, M], computed and returned
    in the wider of the state's dtype and state_dtype(q.dtype) (float32 for a half-precision query)."""
    check_tensor("fast_weight_read", "q", q, "[B, H, Tq, E]")
    B, H, _, E = q.shape
    check_tensor("fast_weight_read", "state", state, "[B, H, E, M]", sizes=(B, H, E, None), like=("q", q))
    dtype = torch.promote_types(state_dtype(q.dtype), state.dtype)
    return torch.einsum("bhte,bhem->bhtm", q.to(dtype), state.to(dtype))


def _kernel_state(q, k, v, state0):
    """Contiguous initial state in the kernel's state dtype (zeros if none given)."""
    if state0 is None:
        B, H, _, E = k.shape
        return torch.zeros(B, H, E, v.shape[-1], dtype=state_dtype(q.dtype), device=q.device)
    return state0.to(state_dtype(q.dtype)).contiguous()


def _check_causal(fn, q, k, v, scalars, initial_state, names=("q", "k", "v")):
    """Validate, promote q, k, v and the per-position scalars ({name: [B, H, T] tensor}, e.g. beta)
    to one float dtype and make them contiguous. Returns (q, k, v, [the scalars in order], initial_state)."""
    check_tensor(fn, names[0], q, "[B, H, T, E]")
    B, H, T, E = q.shape
    if T < 1:
        raise ValueError(f"{fn}: {names[0]} has T={T} positions; T must be >= 1")
    first = (names[0], q)
    check_tensor(fn, names[1], k, "[B, H, T, E]", sizes=q.shape, like=first)
    check_tensor(fn, "v", v, "[B, H, T, M]", sizes=(B, H, T, None), like=first)
    for name, x in scalars.items():
        check_tensor(fn, name, x, "[B, H, T]", sizes=(B, H, T), like=first)
    if initial_state is not None:
        check_tensor(fn, "initial_state", initial_state, "[B, H, E, M]", sizes=(B, H, E, v.shape[-1]), like=first)
    dtype = q.dtype
    for x in (k, v, *scalars.values()):
        dtype = torch.promote_types(dtype, x.dtype)
    q, k, v = (x.to(dtype).contiguous() for x in (q, k, v))
    return q, k, v, [x.to(dtype).contiguous() for x in scalars.values()], initial_state
