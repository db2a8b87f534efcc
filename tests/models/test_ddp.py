"""fairseq trains with DistributedDataParallel: two gloo processes on CPU, each with half of the
batch, must produce the gradients of one process on the whole batch, with no unused parameters."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from factories import build_model, random_tokens

STEPS = 2  # a second backward fails under DDP if any parameter went unused in the first


def batch(d):
    g = torch.Generator().manual_seed(7)
    return random_tokens(d, 4, 6, g), random_tokens(d, 4, 5, g), random_tokens(d, 4, 5, g)


def loss_fn(model, src, prev, target):
    logits, _ = model(src, torch.full((src.size(0),), src.size(1)), prev)
    return torch.nn.functional.cross_entropy(logits.transpose(1, 2), target, reduction="sum")


def model_for(fw):
    model, d = build_model(fw)
    return model.train(), d


def worker(rank, world, init_file, fw, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    model, d = model_for(fw)
    ddp = DistributedDataParallel(model, find_unused_parameters=False)
    src, prev, target = (t[rank::world] for t in batch(d))
    for _ in range(STEPS):
        ddp.zero_grad()
        loss_fn(ddp, src, prev, target).backward()
    if rank == 0:
        torch.save({n: p.grad for n, p in model.named_parameters()}, out_file)
    # A worker aborted after its work once in ~15 runs ("terminate called without an active exception", SIGABRT: a
    # C++ thread destroyed unjoined), with a barrier before destroy_process_group too. DDP's reducer holds the gloo
    # group: it goes first, the group is destroyed while both ranks are there, and the worker leaves without the
    # interpreter's teardown of torch's C++ objects (its results are written; an error before here still fails).
    del ddp
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


@pytest.mark.parametrize("fw", [["--fw-feature-map", "dpfp", "--fw-update-rule", "delta"],
                                ["--fw-feature-map", "elu", "--fw-update-rule", "sum",
                                 "--fw-decoder-rule", "sum"]])
def test_ddp_gradients_equal_single_process(tmp_path, fw):
    out_file = tmp_path / "grads.pt"
    mp.spawn(worker, args=(2, tmp_path / "init", fw, out_file), nprocs=2, join=True)
    ddp_grads = torch.load(out_file)

    model, d = model_for(fw)
    src, prev, target = batch(d)
    model.zero_grad()
    # DDP averages the two ranks' gradients of their half-batch sums.
    (sum(loss_fn(model, src[r::2], prev[r::2], target[r::2]) for r in range(2)) / 2).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        torch.testing.assert_close(ddp_grads[name], p.grad, rtol=1e-8, atol=1e-10, msg=name)
