"""Shared pieces of the ops tests: realistic fast weight inputs (bounded delta rule), and the two forms of
the ops that have a CPU kernel."""
import pytest
import torch

from fw_fairseq.ops import dpfp, sum_normalize


def make_fast_weight_inputs(B=2, H=3, T=37, E=8, M=5, dtype=torch.float64, seed=0, requires_grad=False):
    """q, k [B, H, T, E] sum-normalised DPFP features; v [B, H, T, M]; beta in (0, 1) [B, H, T];
    initial_state [B, H, E, M]. Normalised keys and beta < 1 keep the delta rule contractive,
    as in the paper; random unnormalised keys make it explode."""
    g = torch.Generator().manual_seed(seed)
    if E % 2:  # odd E: no DPFP of that width, use positive features normalised directly
        phi = lambda: torch.rand(B, H, T, E, generator=g, dtype=torch.float64) + 0.1  # noqa: E731
    else:
        d = E // 2  # DPFP-1 of a d-dim input is 2d wide
        phi = lambda: dpfp(torch.randn(B, H, T, d, generator=g, dtype=torch.float64), 1)  # noqa: E731
    q = sum_normalize(phi())
    k = sum_normalize(phi())
    v = torch.randn(B, H, T, M, generator=g, dtype=torch.float64)
    beta = torch.sigmoid(torch.randn(B, H, T, generator=g, dtype=torch.float64))
    state = 0.5 * torch.randn(B, H, E, M, generator=g, dtype=torch.float64)
    tensors = [x.to(dtype).requires_grad_(requires_grad) for x in (q, k, v, beta, state)]
    return tensors


@pytest.fixture
def make_inputs():
    return make_fast_weight_inputs


@pytest.fixture(params=["kernel", "torch"])
def cpu_form(request, monkeypatch):
    """The ops with a compiled CPU kernel (fw_fairseq._cpu: DPFP, the decoding steps) on the kernel, then
    in their PyTorch form (the extension taken away)."""
    from fw_fairseq.ops.kernels import cpu_extension

    if request.param == "kernel" and cpu_extension.cpu_kernel(torch.zeros(1)) is None:
        pytest.skip("fw_fairseq._cpu is not built")
    if request.param == "torch":
        monkeypatch.setattr(cpu_extension, "_cpu", False)
    return request.param
