"""A rule added through the public registration alone (ops.register_rule): a "scaled sum" rule,
W_t = W_{t-1} + c_t phi(k_t) v_t^T with a learned per-position scalar c_t in (0, 1), defined here from its maths.
Its forms agree with its own loop in float64 (outputs and gradients); fairseq's parser takes it for every block;
a model with it trains, and decodes token by token as it reads under teacher forcing (float64), past the step
where the lazy cache is folded into the state; a form it lacks is refused in one line naming the rule and the form."""
import dataclasses

import pytest
import torch

from factories import build_model, decode_step_by_step, random_tokens, randomize_scalar_projections
from fw_fairseq.ops import RULES, MissingForm, UpdateRule, register_rule
from fw_fairseq.ops.rules.public import fused_read
from fw_fairseq.ops.rules.reference import steps, zero_state
from fw_fairseq.ops.rules.sum.chunked import chunked_sum
from fw_fairseq.ops.rules.sum.record import sum_memory
from fw_fairseq.ops.rules.sum.step import in_place_step_sum, step_sum

NAME = "scaled_sum"


def naive_scaled_sum(q, k, v, c, initial_state=None, output_final_state=False):
    """The rule's reference loop: W_t = W_{t-1} + c_t k_t^T v_t; o_t = q_t W_t."""
    W = zero_state(k, v, initial_state)  # [B, H, E, M]
    outputs = []
    for q_t, k_t, v_t, c_t in zip(*steps(q, k, v, c)):  # [B, H, E], [B, H, E], [B, H, M], [B, H]
        W = W + c_t[..., None, None] * k_t[..., None] * v_t[:, :, None, :]
        outputs.append(torch.einsum("bhe,bhem->bhm", q_t, W))
    return torch.stack(outputs, dim=2), (W if output_final_state else None)  # o [B, H, T, M]


def _scaled(v, c):
    return c[..., None] * v  # [B, H, T, 1] * [B, H, T, M]: the rule writes c_t v_t where the sum rule writes v_t


SCALED_SUM = UpdateRule(
    name=NAME, scalars=("c",), pad_values={"c": 0.0}, normalised_phi=False, z_column=True,
    naive=naive_scaled_sum,
    chunked=lambda q, k, v, c, initial_state=None, output_final_state=False: chunked_sum(
        q, k, _scaled(v, c), initial_state, output_final_state),
    step=lambda q, k, v, c, initial_state=None, output_final_state=False: step_sum(
        q, k, _scaled(v, c), initial_state, output_final_state),
    memory=lambda k, v, c: sum_memory(k, _scaled(v, c)),
    writes=lambda phi_k, v, c: _scaled(v, c), short_with_grad=True,
    key_reads=False, write_of=lambda v, key_read, c: _scaled(v, c),
    in_place_step=lambda q, k, v, c, state, order=None, out=None: in_place_step_sum(
        q, k, _scaled(v, c), state, order, out),
)


@pytest.fixture
def scaled_sum():
    """The rule registered for one test, then taken out of the table again."""
    yield register_rule(SCALED_SUM)
    RULES.pop(NAME)


def _inputs(T, g):
    q, k = (torch.rand(2, 3, T, 6, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64)
    c = torch.rand(2, 3, T, generator=g, dtype=torch.float64)
    return [x.requires_grad_() for x in (q, k, v, c)]


@pytest.mark.parametrize("T", [1, 40, 150])
def test_its_forms_agree_with_its_loop(scaled_sum, T):
    g = torch.Generator().manual_seed(T)
    inputs = _inputs(T, g)
    state = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64)
    ours = scaled_sum.causal(*inputs, initial_state=state, output_final_state=True)
    ref = naive_scaled_sum(*inputs, state, True)
    upstream = [torch.randn_like(x) for x in ref]
    for a, b in zip(torch.autograd.grad(ours, inputs, upstream), torch.autograd.grad(ref, inputs, upstream)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    q, k, v, c = inputs
    memory = naive_scaled_sum(k, k, v, c, output_final_state=True)[1]
    torch.testing.assert_close(scaled_sum.write(k, v, c), memory, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(scaled_sum.attend(q, k, v, c), q @ memory, rtol=1e-12, atol=1e-12)


def _args(places="all"):
    return ["--fw-attention", places, "--fw-feature-map", "elu", "--fw-update-rule", NAME, "--fw-decoder-rule", NAME,
            "--no-token-positional-embeddings"]


def test_a_model_with_it_trains(scaled_sum):
    """fairseq's parser allows the registered name; every block runs the rule, its c projection learns, and a
    few updates lower the loss of a fixed batch."""
    model, d = build_model(_args(), dtype=torch.float32)
    model.train()
    blocks = [m for m in model.modules() if getattr(m, "rule", None) is scaled_sum]
    assert len(blocks) == 6  # 2 encoder, 2 decoder self- and 2 cross-attention blocks
    g = torch.Generator().manual_seed(0)
    src, prev = random_tokens(d, 4, 9, g), random_tokens(d, 4, 8, g)
    target = random_tokens(d, 4, 8, g)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        logits = model(src, torch.full((4,), 9), prev)[0]  # [B, T, V]
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten())
        optimizer.zero_grad()
        loss.backward()
        assert blocks[0].c_proj.weight.grad.abs().sum() > 0
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("grad", [False, True], ids=["generation", "autograd"])
def test_incremental_decoding_equals_teacher_forcing(scaled_sum, grad):
    """Past the fold of the lazy cache into the state (ELU+1: E = 16 keys, M = 17 with the z column, so the cache
    folds after 8 positions); generation steps the state in place."""
    model, d = build_model(_args())
    for attention in (layer.self_attn for layer in model.decoder.layers):
        randomize_scalar_projections(attention, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(2)
    src, prev = random_tokens(d, 3, 7, g), random_tokens(d, 3, 20, g)
    with torch.set_grad_enabled(grad):
        encoder_out = model.encoder(src, src_lengths=torch.full((3,), 7))
        expected = model(src, torch.full((3,), 7), prev)[0]  # [B, T, V]
        stepwise = decode_step_by_step(model, prev, encoder_out)
    torch.testing.assert_close(stepwise, expected, rtol=1e-10, atol=1e-10)


def test_a_form_it_lacks_is_refused_in_one_line(scaled_sum):
    """No memory form: the non-causal memory refuses by name; no fused GPU read: the fused read's entry refuses."""
    q, k, v, c = (x.detach() for x in _inputs(5, torch.Generator().manual_seed(0)))
    without = dataclasses.replace(scaled_sum, name="scaled_sum_without_memory", memory=None, writes=None)
    with pytest.raises(MissingForm, match=r"^update rule 'scaled_sum_without_memory' has no memory form [^\n]*$"):
        without.write(k, v, c)
    with pytest.raises(ValueError, match=rf"^fused_read: [^\n]*{NAME}[^\n]*$"):
        fused_read(None, NAME, q, k, v, (c,), causal=True)
