"""The kernels in csrc/cuda/ against the reference loops (fw_fairseq.ops.rules.naive): outputs, final states and
the gradients of q, k, v, beta, alpha and the initial state under random upstream gradients, for the
sum, delta and gated delta rules.

Two backends run the same checks through the ops developer's autograd wrapper
(fw_fairseq.ops.kernels.cuda_functions.KernelFunction, which takes the extension as an argument):
- "compiled": fw_fairseq._cuda on a GPU, in float64, float32, bfloat16 and float16;
- "emulated": the same kernel code on the CPU (tests/cuda/emulator), computing in float64, small shapes.
On a GPU the public fast_weight_sum / _delta / _gated_delta are also checked to dispatch to the kernel;
everywhere, their CUDA branch (dispatch, wrappers, the binding's dtype contract) runs on the emulated
kernels against the same rules as the chunked branch: results, dtypes, an empty batch, double backward.
Tolerances are on ||got - ref|| / ||ref|| against float64 naive loops run on the same
(dtype-rounded) inputs: float64 1e-12; float32 1e-4; bfloat16 and float16 2e-2 (outputs and
gradients are rounded to those 8- and 11-bit mantissas; accumulation is float32).
"""
import pytest
import torch

from fw_fairseq.ops import RULES as UPDATE_RULES
from fw_fairseq.ops import fast_weight_delta, fast_weight_gated_delta, fast_weight_sum, fast_weight_write
from fw_fairseq.ops.kernels import cuda_extension as public
from fw_fairseq.ops.kernels.cuda_functions import KernelFunction
from fw_fairseq.ops.rules.delta.naive import naive_delta, naive_gated_delta
from fw_fairseq.ops.rules.sum.naive import naive_sum

TOL = {torch.float64: 1e-12, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
# (B, H, T, E, M): T = 1, odd T, E != M, M = d_value + 1 = 65, the limits E = 512 and M = 129 (and
# 160), E = 384 (DPFP nu = 3), widths that are not multiples of 32 or of the per-block tiles.
GPU_SHAPES = [(2, 3, 1, 64, 65), (2, 3, 7, 64, 65), (1, 2, 64, 128, 65), (2, 2, 33, 384, 65),
              (1, 2, 257, 512, 129), (1, 1, 50, 16, 3), (1, 2, 17, 100, 160), (3, 1, 40, 33, 1)]
# Emulated: together these reach all 9 column tiers (rows P = E, and P = M in the sum rule's dq and dk
# passes: P = 16, 24, 33, 65, 100, 129, 200, 300, 512 pick them in order) and all 5 row tiers (M = 9,
# 33, 65, 100, 129), with the limits E = 512 and M = 129 in one shape, M = 160, and two heads.
EMULATED_SHAPES = [(1, 2, 5, 40, 9), (1, 1, 1, 70, 33), (2, 1, 3, 16, 3), (1, 1, 2, 100, 65), (1, 1, 2, 400, 5),
                   (1, 1, 2, 512, 129), (1, 1, 3, 24, 100), (2, 1, 2, 200, 2), (1, 1, 2, 300, 1), (1, 1, 2, 33, 160)]
# The step kernel's blocks (groups x M threads): 29 x 9 = 261 (partial last warp), 4 x 65, 2 x 129 at
# the limits, 2 x 160, and 4 x 4 where E = 4 rows caps the 64 groups that M = 4 would get.
EMULATED_STEP_SHAPES = [(1, 2, 4, 40, 9), (2, 1, 3, 64, 65), (1, 2, 2, 512, 129), (1, 1, 2, 7, 160), (1, 1, 2, 4, 4)]
RULES = ["sum", "delta", "gated_delta"]
SCALARS = {"sum": [], "delta": ["beta"], "gated_delta": ["beta", "alpha"]}  # the per-position inputs


def make_inputs(B, H, T, E, M, dtype, device, seed=0):
    """q, k sum-normalised positive features (as the delta rule's phi' makes them), beta in (0, 1),
    alpha in [0.5, 1): the delta rule's state then stays bounded over long T. Leaves in dtype, on
    device: q, k, v, beta, alpha, state0."""
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(B, H, T, E, generator=g, dtype=torch.float64)
    k = torch.rand(B, H, T, E, generator=g, dtype=torch.float64)
    q, k = q / q.sum(-1, keepdim=True), k / k.sum(-1, keepdim=True)
    v = torch.randn(B, H, T, M, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64)
    alpha = 0.5 + 0.5 * torch.rand(B, H, T, generator=g, dtype=torch.float64)
    state0 = 0.1 * torch.randn(B, H, E, M, generator=g, dtype=torch.float64)
    state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    xs = [x.to(dtype) for x in (q, k, v, beta, alpha)] + [state0.to(state_dtype)]
    return [x.to(device).requires_grad_() for x in xs]


_NAIVE = {"sum": naive_sum, "delta": naive_delta, "gated_delta": naive_gated_delta}
_PUBLIC = {"sum": fast_weight_sum, "delta": fast_weight_delta, "gated_delta": fast_weight_gated_delta}


def rule_inputs(rule, inputs):
    """The inputs rule reads, in its ops' order: q, k, v, its per-position scalars, state0."""
    q, k, v, beta, alpha, s0 = inputs
    return [q, k, v, *({"beta": beta, "alpha": alpha}[name] for name in SCALARS[rule]), s0]


def run(rule, fn, inputs):
    """(o, final_state) of fn; fn is an ext (through the autograd wrapper, KernelFunction, under the rule's
    kernel name) or 'naive' or 'public'."""
    args = rule_inputs(rule, inputs)
    if fn == "naive":
        return _NAIVE[rule](*args, True)
    if fn == "public":
        return _PUBLIC[rule](*args, True)
    return KernelFunction.apply(fn, UPDATE_RULES[rule].kernel, *args)


def check_against_naive(rule, fn, inputs, tol):
    """Compares outputs, final state and all gradients of fn with the float64 naive loops."""
    names = ["o", "state", "dq", "dk", "dv", "dbeta", "dalpha", "dstate0"]
    wrt = [0, 1, 2] + [{"beta": 3, "alpha": 4}[name] for name in SCALARS[rule]] + [5]
    ref_inputs = [x.detach().cpu().double().requires_grad_() for x in inputs]
    poison_cuda_cache()
    o, s = run(rule, fn, inputs)
    g = torch.Generator().manual_seed(1)
    do, ds = torch.randn(o.shape, generator=g, dtype=torch.float64), torch.randn(s.shape, generator=g, dtype=torch.float64)
    poison_cuda_cache()
    grads = torch.autograd.grad((o, s), [inputs[i] for i in wrt], (do.to(o), ds.to(s)))
    o_ref, s_ref = run(rule, "naive", ref_inputs)
    ref_grads = torch.autograd.grad((o_ref, s_ref), [ref_inputs[i] for i in wrt], (do, ds))
    got, ref = [o, s, *grads], [o_ref, s_ref, *ref_grads]
    for name, a, b in zip([n for i, n in enumerate(names) if i < 2 or i - 2 in wrt], got, ref):
        assert a.shape == b.shape and torch.isfinite(a).all(), f"{rule} {name}: shape or non-finite elements"
        err = ((a.double().cpu() - b).norm() / b.norm().clamp_min(1e-30)).item()
        assert err < tol, f"{rule} {name}: relative error {err:.2e} >= {tol:.0e}"


def check_steps_equal_forward(rule, ext, inputs):
    """T single decoding steps (state updated in place) == one forward over T, outputs and state."""
    inputs = [x.detach() for x in inputs]
    with torch.no_grad():
        o_full, s_full = run(rule, ext, inputs)
        state, outs = inputs[-1].clone(), []
        for t in range(inputs[0].shape[2]):
            step = [x[:, :, t : t + 1].contiguous() for x in rule_inputs(rule, inputs)[:-1]]
            poison_cuda_cache()
            outs.append(getattr(ext, f"{UPDATE_RULES[rule].kernel}_step")(*step, state))
    torch.testing.assert_close(torch.cat(outs, dim=2), o_full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state, s_full, rtol=1e-5, atol=1e-6)


def poison_cuda_cache():
    """Leave NaN in the memory the caching allocator hands out next, so that an output element no
    kernel writes reads as NaN (the extension allocates its outputs with at::empty)."""
    if torch.cuda.is_available():
        for numel in (1 << 26, 1 << 22, 1 << 18, 1 << 14, 1 << 10):
            torch.full((numel,), float("nan"), device="cuda")


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", EMULATED_SHAPES, ids=lambda s: "B{}H{}T{}E{}M{}".format(*s))
def test_emulated_kernels_match_naive(emulated, rule, shape):
    check_against_naive(rule, emulated, make_inputs(*shape, torch.float64, "cpu"), TOL[torch.float64])


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", EMULATED_STEP_SHAPES, ids=lambda s: "B{}H{}T{}E{}M{}".format(*s))
def test_emulated_steps_equal_forward(emulated, rule, shape):
    check_steps_equal_forward(rule, emulated, make_inputs(*shape, torch.float64, "cpu"))


def test_step_launch_fits_every_accepted_shape(emulated):
    """The step launcher's block for every E, M the binding accepts: at most 1024 threads, and dynamic
    shared memory (for double, the widest acc_t) under the 48 KiB a launch gets without
    cudaFuncSetAttribute. test_compile checks the kernel's registers for 1024 threads and that it has
    no static shared memory."""
    for E in range(1, emulated.MAX_E + 1):
        for M in range(1, emulated.MAX_M + 1):
            threads, smem = emulated.step_geometry(E, M)
            assert threads % M == 0 and M <= threads <= 1024 and smem <= 48 * 1024, (E, M, threads, smem)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "B{}H{}T{}E{}M{}".format(*s))
def test_compiled_kernels_match_naive(compiled, rule, dtype, shape):
    check_against_naive(rule, compiled, make_inputs(*shape, dtype, "cuda"), TOL[dtype])


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", [(2, 3, 9, 64, 65), (1, 2, 5, 512, 129)], ids=lambda s: "E{3}M{4}".format(*s))
def test_compiled_steps_equal_forward(compiled, rule, shape):
    check_steps_equal_forward(rule, compiled, make_inputs(*shape, torch.float32, "cuda"))


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_public_ops_dispatch_to_the_kernel(compiled, rule, dtype):
    inputs = make_inputs(2, 4, 45, 64, 65, dtype, "cuda")
    assert public.cuda_kernel(inputs[0], inputs[2], UPDATE_RULES[rule].kernel) is compiled
    check_against_naive(rule, "public", inputs, TOL[dtype])


@pytest.mark.parametrize("rule", RULES)
def test_compiled_split_and_resume_equals_one_call(compiled, rule):
    *seqs, s0 = [x.detach() for x in make_inputs(2, 2, 50, 64, 65, torch.float32, "cuda")]
    o_full, s_full = run(rule, compiled, [*seqs, s0])
    halves = [[x[:, :, :19].contiguous() for x in seqs], [x[:, :, 19:].contiguous() for x in seqs]]
    o1, s1 = run(rule, compiled, [*halves[0], s0])
    o2, s2 = run(rule, compiled, [*halves[1], s1])
    torch.testing.assert_close(torch.cat([o1, o2], dim=2), o_full, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(s2, s_full, rtol=1e-5, atol=1e-6)


def test_compiled_rejects_bad_inputs_with_clear_messages(compiled):
    q, k, v, beta, alpha, s0 = [x.detach() for x in make_inputs(1, 2, 5, 16, 8, torch.float32, "cuda")]
    cases = [
        ((q.cpu(), k, v, s0), "must be a CUDA tensor"),
        ((q.half(), k, v, s0), "has dtype"),
        ((q, k, v, s0.double()), "state has dtype"),
        ((q, k[:, :, :4], v, s0), "k has shape"),
        ((q.transpose(2, 3).contiguous().transpose(2, 3), k, v, s0), "must be contiguous"),
        ((q, k, v, s0[..., :4]), "state has shape"),
    ]
    for args, message in cases:
        with pytest.raises(RuntimeError, match=message):
            compiled.sum_forward(*args)
    with pytest.raises(RuntimeError, match="alpha has shape"):
        compiled.gated_delta_forward(q, k, v, beta, alpha[:, :, :4], s0)
    big = torch.zeros(1, 1, 2, compiled.MAX_E + 1, device="cuda")
    with pytest.raises(RuntimeError, match=f"E = {compiled.MAX_E + 1}"):
        compiled.sum_forward(big, big, v[:, :1, :2], torch.zeros(1, 1, compiled.MAX_E + 1, 8, device="cuda"))
    with pytest.raises(RuntimeError, match="expected 1"):
        compiled.delta_step(q, k, v, beta, s0)
    with pytest.raises(TypeError):  # each rule's functions take exactly that rule's scalars
        compiled.delta_forward(q, k, v, s0)


@pytest.fixture
def emulated_branch(emulated, monkeypatch):
    """The public ops take their CUDA branch on CPU tensors, with the emulated kernels."""
    monkeypatch.setattr(public, "cuda_kernel", lambda q, v, rule: emulated)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("shape", [(2, 3, 1, 8, 5), (2, 1, 6, 8, 5), (0, 2, 5, 8, 3), (2, 0, 1, 8, 3)],
                         ids=lambda s: "B{}H{}T{}E{}M{}".format(*s))
def test_public_cuda_branch_matches_naive(emulated_branch, rule, shape):
    check_against_naive(rule, "public", make_inputs(*shape, torch.float64, "cpu"), TOL[torch.float64])


@pytest.mark.parametrize("rule", ["delta", "gated_delta"])
def test_public_cuda_branch_writes_the_final_state(emulated_branch, rule):
    # fast_weight_write runs the rule's own kernel (reading with q = k) and keeps its final state
    inputs = make_inputs(2, 3, 7, 8, 5, torch.float64, "cpu")
    _, k, v, *scalars, _ = rule_inputs(rule, inputs)
    _, expected = run(rule, "naive", [*inputs[:5], torch.zeros_like(inputs[5])])
    torch.testing.assert_close(fast_weight_write(k, v, *scalars), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_public_cuda_branch_follows_the_dtype_rule(emulated_branch, rule, T, dtype):
    inputs = make_inputs(2, 2, T, 8, 5, dtype, "cpu")
    with torch.no_grad():  # T = 1: the step kernel
        results = run(rule, "public", inputs)
    o, s = run(rule, "public", inputs)
    wrt = rule_inputs(rule, inputs)
    grads = torch.autograd.grad(o.sum() + s.sum(), wrt)
    assert [x.dtype for x in (*results, o, s)] == [torch.float32] * 4
    assert [g.dtype for g in grads] == [x.dtype for x in wrt]


@pytest.mark.parametrize("T", [1, 4])
def test_public_cuda_branch_fp16_sum_outputs_do_not_overflow(emulated_branch, T):
    # q = k = 1 (E = 8), v = 4096 and a state of 4096s: o_t = 8 * 4096 * (t + 1) passes fp16's 65504
    q = torch.ones(1, 1, T, 8, dtype=torch.float16)
    v = torch.full((1, 1, T, 3), 4096.0, dtype=torch.float16)
    state = torch.full((1, 1, 8, 3), 4096.0)
    with torch.no_grad():  # T = 1: the step kernel
        o, _ = fast_weight_sum(q, q, v, state)
    expected = 8 * 4096.0 * torch.arange(2, T + 2, dtype=torch.float32)
    torch.testing.assert_close(o, expected[None, None, :, None].expand(1, 1, T, 3), rtol=0, atol=0)


@pytest.mark.parametrize("branch", ["chunked", "cuda"])
@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("upstream", ["constant", "differentiable"])
def test_double_backward_fails_loudly_on_both_branches(emulated, monkeypatch, branch, rule, upstream):
    if branch == "cuda":
        monkeypatch.setattr(public, "cuda_kernel", lambda q, v, rule: emulated)
    inputs = make_inputs(1, 2, 6, 8, 3, torch.float64, "cpu")
    q = inputs[0]
    o, _ = run(rule, "public", inputs)
    w = torch.randn(o.shape, dtype=torch.float64, requires_grad=upstream == "differentiable")
    # a gradient penalty beside a term that needs no second derivative: a first-order gradient
    # without a graph would drop the penalty's part of the result without a word
    with pytest.raises(RuntimeError, match="double backward"):
        (g,) = torch.autograd.grad((o * w).sum(), q, create_graph=True)
        torch.autograd.grad(g.square().sum() + q.square().sum(), q)
