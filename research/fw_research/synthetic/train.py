"""Training to convergence with the paper's stopping rule (§6.1.1).

Train with Adam on fresh random batches; every `eval_every` steps evaluate on a fixed set of
sequences with all their queries; stop when the eval loss falls below `target_loss`, when it has not
improved for `patience` steps, or at `max_steps`. The reported number is the best eval loss.
"""
import math
import time
from dataclasses import dataclass

import torch

from .data import evaluation_batch, retrieval_loss, training_batch


@dataclass
class TrainConfig:
    batch_size: int = 32
    lr: float = 1e-3  # Adam's default, as in the paper
    max_steps: int = 100_000
    eval_every: int = 100
    eval_sequences: int = 20  # paper: 20 sequences x all S queries
    patience: int = 1000  # steps without a new best eval loss
    target_loss: float = 1e-3
    seed: int = 1


@torch.no_grad()
def evaluate(model, eval_set, chunk=32):
    """Mean loss over every scored (sequence, query) pair of eval_set = (keys, values, queries, targets).

    Sequences go through in chunks so the [chunk, E, S] memories stay small at large S; the loss is
    weighted by the number of scored queries so chunking does not change the mean.
    """
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for start in range(0, eval_set[0].shape[0], chunk):
        keys, values, queries, targets = (x[start : start + chunk] for x in eval_set)
        n = int((targets >= 0).sum())
        total += float(retrieval_loss(model(keys, values, queries), targets)) * n
        count += n
    model.train(was_training)
    return total / count


def train(model, num_symbols, length, replace, config, device="cpu", log=None):
    """Train `model` (already on `device`) on sequences of `length` writes over `num_symbols` symbols.

    Batches are drawn on the CPU from seeded generators (identical data on every device) and moved.

    Returns a dict: best_eval_loss, final_eval_loss, steps, stop ('target', 'patience', 'max_steps'
    or 'nan'), seconds, curve [[step, eval_loss], ...].
    """
    torch.manual_seed(config.seed)
    train_gen = torch.Generator().manual_seed(config.seed)
    eval_gen = torch.Generator().manual_seed(config.seed + 1_000_003)  # never overlaps the training stream
    eval_set = [x.to(device) for x in evaluation_batch(config.eval_sequences, num_symbols, length, replace, eval_gen)]
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr)
    model.train()
    best, best_step, curve, stop = math.inf, 0, [], "max_steps"
    start = time.time()
    step = 0
    for step in range(1, config.max_steps + 1):
        batch = training_batch(config.batch_size, num_symbols, length, replace, train_gen)
        keys, values, queries, targets = (x.to(device) for x in batch)
        loss = retrieval_loss(model(keys, values, queries), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % config.eval_every and step < config.max_steps:  # the last step is always evaluated
            continue
        eval_loss = evaluate(model, eval_set)
        curve.append([step, eval_loss])
        if log is not None:
            log(f"step {step:6d}  train {loss.item():.5f}  eval {eval_loss:.5f}")
        if not math.isfinite(eval_loss):
            stop = "nan"
            break
        if eval_loss < best:
            best, best_step = eval_loss, step
        if best < config.target_loss:
            stop = "target"
            break
        if step - best_step >= config.patience:
            stop = "patience"
            break
    return {
        "best_eval_loss": best,
        "final_eval_loss": curve[-1][1] if curve else math.nan,
        "steps": step,
        "stop": stop,
        "seconds": round(time.time() - start, 1),
        "curve": curve,
    }
