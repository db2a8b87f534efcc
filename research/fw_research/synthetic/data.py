"""Associative retrieval sequences (paper §6.1): L (key, value) writes, then queries.

Keys and values are both symbols 0..S-1. Value i stands for the fixed one-hot vector e_i in R^S;
the one-hot encoding is done by the model, the data stays integer.

Setting 1 (capacity): L = S, keys and values sampled without replacement, so each key appears once.
Setting 2 (update rules): L = 2S, sampled with replacement; a key may be re-bound several times and
the target is the value written with its *most recent* occurrence.
"""
import torch


def sample_sequences(n, num_symbols, length, replace, generator=None):
    """keys, values: [n, L] int64 in 0..S-1, drawn independently (with or without replacement)."""
    if not replace and length > num_symbols:
        raise ValueError(f"without replacement L={length} cannot exceed S={num_symbols}")
    if replace:
        keys = torch.randint(num_symbols, (n, length), generator=generator)
        values = torch.randint(num_symbols, (n, length), generator=generator)
    else:
        # argsort of uniform noise is a uniform random permutation per row
        keys = torch.rand(n, num_symbols, generator=generator).argsort(dim=-1)[:, :length]
        values = torch.rand(n, num_symbols, generator=generator).argsort(dim=-1)[:, :length]
    return keys, values


def latest_values(keys, values, num_symbols):
    """[n, S]: the value most recently written with each key symbol, or -1 if it never occurs.

    Uses the position of the last occurrence (scatter amax) rather than scattering the values
    themselves, because scatter with repeated indices keeps an unspecified one of them.
    """
    n, length = keys.shape
    positions = torch.arange(length, device=keys.device).expand(n, length)  # [n, L]
    last = torch.full((n, num_symbols), -1, dtype=torch.long, device=keys.device)
    last = last.scatter_reduce(1, keys, positions, reduce="amax")  # [n, S]
    latest = values.gather(1, last.clamp_min(0))  # [n, S]
    return latest.masked_fill(last < 0, -1)


def training_batch(batch_size, num_symbols, length, replace, generator=None):
    """One query per sequence, chosen like the authors' generator: a uniformly random *position*,
    so a key written twice is queried twice as often.

    Returns keys, values [B, L]; queries, targets [B, 1] (targets in 0..S-1).
    """
    keys, values = sample_sequences(batch_size, num_symbols, length, replace, generator)
    position = torch.randint(length, (batch_size, 1), generator=generator)  # [B, 1]
    queries = keys.gather(1, position)  # [B, 1]
    targets = latest_values(keys, values, num_symbols).gather(1, queries)  # [B, 1]
    return keys, values, queries, targets


def evaluation_batch(n_sequences, num_symbols, length, replace, generator=None):
    """Every key symbol queried against every sequence (paper: 20 sequences x all queries).

    Returns keys, values [N, L]; queries [N, S] (= 0..S-1 in each row); targets [N, S] with -1 where
    that key does not occur in the sequence (only possible with replacement): those are not scored.
    """
    keys, values = sample_sequences(n_sequences, num_symbols, length, replace, generator)
    queries = torch.arange(num_symbols).expand(n_sequences, num_symbols).contiguous()  # [N, S]
    return keys, values, queries, latest_values(keys, values, num_symbols)


def retrieval_loss(v_hat, targets):
    """Paper's loss sum_j 1/2 (v*_j - v_hat_j)^2, averaged over the scored queries.

    v_hat: [B, Q, S]; targets: [B, Q] in 0..S-1, or -1 for queries that are not scored.
    """
    scored = targets >= 0  # [B, Q]
    one_hot = torch.nn.functional.one_hot(targets.clamp_min(0), v_hat.shape[-1]).to(v_hat.dtype)  # [B, Q, S]
    per_query = 0.5 * (one_hot - v_hat).pow(2).sum(dim=-1)  # [B, Q]
    return per_query[scored].mean()
