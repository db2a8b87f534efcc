"""What every fast weight op guarantees whatever the caller's torch settings, decided here once for
the chunked and the CUDA paths alike (fw_fairseq/ops/README.md §3).

- One dtype rule, `state_dtype`: fp16/bf16 inputs are computed, accumulated and returned in float32
  (outputs and states alike); float32 and float64 inputs in their own dtype. Half-precision results
  would overflow: the state and the sum rule's unnormalised outputs (numerator and z column) add up
  the whole sequence (ELU+1, E = 64: z . phi(q) grows like 85 t and passes fp16's 65504 at t ~ 650).
  The CUDA binding mirrors the rule (state_dtype in csrc/cuda/fast_weight.cpp).
- Autocast off inside, `autocast_off`: autocast would run the matmuls in half precision against the
  float32 state (a crash: "Input dtypes must be the same") or hand back a half state. Each op casts
  its inputs explicitly instead, so results under autocast equal results without it.
- First-order only, `first_order`: the hand-written backward passes are not themselves differentiable.
`records` says whether autograd will record an op of given tensors; `eager_form` picks the form of a map's maths
(hand-written backward, plain formula under torch.compile, forward alone where nothing is recorded).
"""
import contextlib
import functools

import torch

_HALF_DTYPES = (torch.float16, torch.bfloat16)
_AUTOCAST_DEVICES = ("cpu", "cuda")
_DOUBLE_BACKWARD = ("fw_fairseq.ops: the fast weight ops' hand-written backward is not differentiable; "
                    "create_graph=True (double backward, e.g. a gradient penalty) is not supported")


def state_dtype(dtype):
    """The dtype of the state, of the accumulation and of every result, for inputs of `dtype`."""
    return torch.float32 if dtype in _HALF_DTYPES else dtype


def records(*tensors):
    """Whether autograd will record an op of these tensors (None ones ignored): the one test for where
    the ops keep tensors for a backward or take forms that have one, and where forward-only kernels may run."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def hand_written_backward(*tensors):
    """Whether a Function with a hand-written backward runs for these tensors: eagerly, where autograd
    records one of them; while torch.compile traces, the plain formula runs instead (the compiler
    differentiates and fuses it itself), and where nothing is recorded no Function is needed."""
    return records(*tensors) and not torch.compiler.is_compiling()


def autocast_off(fn):
    """Runs fn with autocast off on every device where the caller has it on (no cost when it is off)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        enabled = [device for device in _AUTOCAST_DEVICES if torch.is_autocast_enabled(device)]
        if not enabled:
            return fn(*args, **kwargs)
        with contextlib.ExitStack() as stack:
            for device in enabled:
                stack.enter_context(torch.autocast(device, enabled=False))
            return fn(*args, **kwargs)

    return run


def first_order(backward):
    """For an autograd Function's hand-written backward: runs it with autocast off (a loss.backward()
    inside an autocast block would otherwise reach it with autocast on), and refuses to run when
    autograd records it, i.e. under create_graph=True (the engine turns grad mode on in a backward
    only then). torch's once_differentiable refuses only where the upstream gradient itself requires
    grad; otherwise it returns gradients without a graph, and a gradient penalty computed from them
    next to any other term silently loses its second-order part."""
    backward_without_autocast = autocast_off(backward)

    @functools.wraps(backward)
    def run(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(_DOUBLE_BACKWARD)
        return backward_without_autocast(ctx, *grads)

    return run


def eager_form(function, plain, alone, x, *args):
    """The one choice of form for the maths of phi, whose Functions (dpfp_function.py, favor_function.py,
    normalize_function.py) compute it in fewer passes than autograd of the plain formula:
    - while torch.compile traces, `plain`(x, *args): the compiler fuses it itself;
    - eagerly where autograd records x, `function`.apply: the hand-written backward;
    - eagerly where it does not (generation, validation), `alone`(x, *args), the forward without the
      Function's call (about 5 us: a fifth of a decoding step's map)."""
    if hand_written_backward(x):
        return function.apply(x, *args)
    return plain(x, *args) if torch.compiler.is_compiling() else alone(x, *args)
