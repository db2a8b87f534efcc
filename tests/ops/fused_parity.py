"""The fused read's parity with its float64 reference, per device, shared by its tests (test_fused_read_*.py).

Without a GPU the kernels run under Triton's interpreter on CPU tensors in float64 and must match the float64
reference to 1e-10, outputs and gradients. Compiled for CUDA they refuse float64 (launch.CUDA_DTYPES), so there
they take the same values rounded to float32 and must match the float64 reference of those rounded values to
FP32_BOUND of the reference's largest entry: float32 products ("ieee") leave about 1e-6 on an H200
(benchmarks/results/gpu_h200_2026-11-27), an indexing slip or a race leaves far more.
"""
import copy

import torch

from fw_research.experiments.fused_read_cases import rel_err

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.float64 if DEVICE == "cpu" else torch.float32
FP64_TOL = 1e-10
FP32_BOUND = 2e-5


def leaves(values):
    """float64 values (None kept) -> (the kernel's leaves in DTYPE on DEVICE, the reference's float64 leaves of
    the same, possibly rounded, values)."""
    kernel = [None if x is None else x.to(DEVICE, DTYPE).requires_grad_() for x in values]
    reference = [None if x is None else x.detach().double().requires_grad_() for x in kernel]
    return kernel, reference


def maps(phi):
    """A feature map as the kernel takes it (DTYPE, DEVICE) and its float64 copy for the reference (the same
    random projection for FAVOR+)."""
    return copy.deepcopy(phi).to(DEVICE, DTYPE), copy.deepcopy(phi).double().to(DEVICE)


def assert_parity(got, want, what):
    """got (the kernel's, DTYPE) against want (float64): elementwise to 1e-10 in float64, else by the largest
    difference over the largest entry."""
    if DTYPE == torch.float64:
        torch.testing.assert_close(got, want, rtol=FP64_TOL, atol=FP64_TOL, msg=lambda m: f"{what}: {m}")
        return
    error = rel_err(got, want)
    assert error <= FP32_BOUND, f"{what}: max |got - ref| / max |ref| = {error:.2e} > {FP32_BOUND:g}"


def assert_read_parity(out, ref, wrt, ref_wrt, names=("q", "k", "v", "beta", "alpha")):
    """A read out (the kernel's, of the leaves wrt) against ref (float64, of ref_wrt): the outputs, then the leaves'
    gradients under one random upstream gradient, each named."""
    grad = torch.randn_like(ref)
    expected = torch.autograd.grad(ref, ref_wrt, grad)
    got = torch.autograd.grad(out, wrt, grad.to(out.dtype))
    assert out.shape == ref.shape
    assert_parity(out, ref, "out")
    for which, a, b in zip(names, got, expected):
        assert_parity(a, b, f"d{which}")
