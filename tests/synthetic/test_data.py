"""The associative retrieval generator (paper §6.1): shapes, sampling, targets, evaluation coverage."""
import torch

from fw_research.synthetic import evaluation_batch, latest_values, retrieval_loss, sample_sequences, training_batch


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_shapes_and_ranges():
    keys, values, queries, targets = training_batch(7, 10, 20, replace=True, generator=_gen())
    assert keys.shape == values.shape == (7, 20)
    assert queries.shape == targets.shape == (7, 1)
    for x in (keys, values, queries, targets):
        assert x.dtype == torch.int64 and x.min() >= 0 and x.max() < 10


def test_without_replacement_each_key_and_value_once():
    keys, values = sample_sequences(50, 12, 12, replace=False, generator=_gen())
    for row in torch.cat([keys, values]):
        assert sorted(row.tolist()) == list(range(12))
    short_keys, _ = sample_sequences(50, 12, 5, replace=False, generator=_gen())
    assert all(len(set(row.tolist())) == 5 for row in short_keys)


def test_latest_values_is_the_most_recent_write():
    keys = torch.tensor([[3, 1, 3, 0, 3, 1]])
    values = torch.tensor([[5, 4, 2, 0, 1, 3]])
    assert latest_values(keys, values, 6).tolist() == [[0, 3, -1, 1, -1, -1]]


def test_training_target_is_the_value_of_the_last_occurrence():
    keys, values, queries, targets = training_batch(200, 5, 10, replace=True, generator=_gen(1))
    repeated = 0
    for k, v, q, y in zip(keys.tolist(), values.tolist(), queries[:, 0].tolist(), targets[:, 0].tolist()):
        positions = [t for t, key in enumerate(k) if key == q]
        assert y == v[positions[-1]]
        repeated += len(positions) > 1 and v[positions[0]] != v[positions[-1]]
    assert repeated > 0  # the "most recent" rule was actually exercised


def test_evaluation_covers_every_query_setting1():
    S = 100
    keys, values, queries, targets = evaluation_batch(20, S, S, replace=False, generator=_gen())
    assert queries.shape == targets.shape == (20, S)
    assert (targets >= 0).sum() == 20 * S  # paper: S = 100 -> 2000 queries
    for k, v, y in zip(keys.tolist(), values.tolist(), targets.tolist()):
        assert all(y[key] == value for key, value in zip(k, v))


def test_evaluation_covers_every_key_present_setting2():
    S = 10
    keys, values, queries, targets = evaluation_batch(20, S, 2 * S, replace=True, generator=_gen())
    for k, v, q, y in zip(keys.tolist(), values.tolist(), queries.tolist(), targets.tolist()):
        assert q == list(range(S))
        assert {s for s in range(S) if y[s] >= 0} == set(k)
        for s in set(k):
            assert y[s] == v[max(t for t, key in enumerate(k) if key == s)]


def test_loss_uses_one_hot_values_and_skips_unscored_queries():
    targets = torch.tensor([[2, -1]])
    perfect = torch.zeros(1, 2, 4)
    perfect[0, 0, 2] = 1.0
    perfect[0, 1] = 7.0  # unscored query: anything goes
    assert retrieval_loss(perfect, targets) == 0
    assert retrieval_loss(torch.zeros(1, 2, 4), targets) == 0.5  # 1/2 |e_2|^2
