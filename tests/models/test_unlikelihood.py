"""`--criterion fw_unlikelihood` (fw_fairseq/criterions/unlikelihood.py): its candidates and its term equal a loop
over positions and previous tokens written out in float64, gradients included, for every window and both kinds of
candidates; a descent step on it lowers every candidate's probability and the term. Through the real CLI:
tests/e2e/test_unlikelihood_cli.py."""
import pytest
import torch

from fw_fairseq.criterions.unlikelihood import ONE_MINUS_P_FLOOR, candidates, unlikelihood

PAD, VOCAB = 1, 9


def _targets():
    """[3, 7] references with repeats, padding at the end of the second and third (fairseq pads on the right)."""
    return torch.tensor([[4, 5, 4, 4, 6, 5, 2],
                         [7, 7, 7, 8, 2, PAD, PAD],
                         [3, 4, 5, 6, 3, 2, PAD]])


def loop_candidates(target, window, kind="previous"):
    """{(b, t): the set of candidate tokens}, written out position by position."""
    out = {}
    for b in range(target.shape[0]):
        for t in range(target.shape[1]):
            if target[b, t] == PAD:
                out[b, t] = set()
                continue
            first = 0 if window == 0 else max(0, t - window)
            previous = {int(target[b, j]) for j in range(first, t)
                        if kind == "previous" or j == t - 1 or (j > 0 and target[b, j - 1] == target[b, t - 1])}
            out[b, t] = previous - {int(target[b, t]), PAD}
    return out


def loop_unlikelihood(lprobs, target, window, kind):
    total = lprobs.new_zeros(())
    for (b, t), tokens in loop_candidates(target, window, kind).items():
        for c in tokens:
            total = total - torch.log((1 - lprobs[b, t, c].exp()).clamp_min(ONE_MINUS_P_FLOOR))
    return total


@pytest.mark.parametrize("kind", ["previous", "continuations"])
@pytest.mark.parametrize("window", [0, 1, 2, 3, 10])
def test_candidates_equal_the_loop(window, kind):
    target = _targets()
    tokens, keep = candidates(target, PAD, window, kind)
    for (b, t), expected in loop_candidates(target, window, kind).items():
        kept = tokens[b, t][keep[b, t]].tolist()
        assert sorted(kept) == sorted(expected), (b, t)  # each candidate once


def test_a_repeat_of_the_reference_is_no_candidate_and_the_first_position_has_none():
    target = _targets()
    tokens, keep = candidates(target, PAD)
    assert not keep[:, 0].any()  # nothing was written before the first token
    assert tokens[0, 3][keep[0, 3]].tolist() == [5]  # y_3 = 4 repeats y_2 = 4: the reference's token is never one
    assert tokens[0, 5][keep[0, 5]].tolist() == [4, 6]  # 4 written three times before, a candidate once
    assert not keep[1, 5:].any() and not keep[2, 6].any()  # padded positions


def test_continuations_are_the_last_token_and_what_followed_it_before():
    target = _targets()
    tokens, keep = candidates(target, PAD, kind="continuations")
    # row 0 is 4 5 4 4 6 5 2: at t = 4 the last token is 4, which was followed by 5 and by 4 before
    assert tokens[0, 4][keep[0, 4]].tolist() == [4, 5]
    # at t = 5 the last token 6 was never written before: only 6 itself, not the earlier 4 and 5
    assert tokens[0, 5][keep[0, 5]].tolist() == [6]


@pytest.mark.parametrize("kind", ["previous", "continuations"])
@pytest.mark.parametrize("window", [0, 2])
def test_the_term_and_its_gradient_equal_the_loop_in_float64(window, kind):
    target = _targets()
    logits = torch.randn(*target.shape, VOCAB, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logits[0, 4, 5] = 12.0  # a candidate near p = 1: -log(1 - p) is large but finite
    logits.requires_grad_(True)
    ours = unlikelihood(torch.log_softmax(logits, -1), target, PAD, window, kind)
    (grad,) = torch.autograd.grad(ours, logits)
    reference = loop_unlikelihood(torch.log_softmax(logits, -1), target, window, kind)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(ours, reference, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, reference_grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: unlikelihood(torch.log_softmax(x, -1), target, PAD, window, kind),
                                    (logits.detach().clone().requires_grad_(True),))


def test_a_descent_step_lowers_the_candidates_probability():
    target = _targets()
    logits = torch.zeros(*target.shape, VOCAB, dtype=torch.float64, requires_grad=True)
    tokens, keep = candidates(target, PAD)
    mask = torch.zeros(*target.shape, VOCAB).scatter_add_(2, tokens, keep.float()) > 0  # [B, T, V]
    (grad,) = torch.autograd.grad(unlikelihood(torch.log_softmax(logits, -1), target, PAD), logits)
    before = torch.softmax(logits, -1)[mask]
    after = torch.softmax(logits - 0.5 * grad, -1)[mask]
    assert (after < before).all()
    assert unlikelihood(torch.log_softmax(logits - 0.5 * grad, -1), target, PAD) < \
        unlikelihood(torch.log_softmax(logits, -1), target, PAD)
