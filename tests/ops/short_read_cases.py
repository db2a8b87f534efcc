"""What the tests of cpu_short_read (test_ops_feature_attend*.py) share: the maps' plain formulas, FAVOR+'s
projection for a head width, the read through the kernel, float64 inputs, and the fixture that runs every test with
the kernel's products through BLAS and through its own loops."""
import pytest
import torch

from fw_fairseq.ops import dpfp, elu_plus_one, feature_map
from fw_fairseq.ops.kernels import cpu_extension
from fw_fairseq.ops.kernels.cpu_extension import cpu_kernel
from fw_fairseq.ops.maps.favor_function import favor_plus, orthogonal_gaussian
from fw_fairseq.ops.rules import raw_read
from fw_fairseq.ops.rules.registry import RULES


def favor_features(nu):
    """FAVOR+'s m in these tests, from the cases' nu: never a multiple of a vector's lanes (the kernel's tails)."""
    return 12 * nu - 5


def projection(name, d, nu):
    """FAVOR+'s R [m, d] for d-wide heads (float64, the same draw for the same d and nu); None for the other maps."""
    if name != "favor":
        return None
    with torch.random.fork_rng():
        torch.manual_seed(d * 100 + nu)
        return orthogonal_gaussian(favor_features(nu), d, None, torch.float64)


# the maps' plain formulas (feature_maps.py), by kernel name: x [..., d], nu (DPFP's; FAVOR+'s m from it), whether x
# holds queries -> phi [..., E]
PLAIN = {"dpfp": lambda x, nu, query: dpfp(x, nu), "elu": lambda x, nu, query: elu_plus_one(x),
         "hedgehog": lambda x, nu, query: torch.cat([torch.softmax(x, -1), torch.softmax(-x, -1)], -1),
         "favor": lambda x, nu, query: favor_plus(x, projection("favor", x.shape[-1], nu).to(x.dtype), query)}


def width(name, d, nu):
    """E of map `name` for d-wide heads: its FeatureMap's out_dim (the width short_read is given)."""
    return feature_map(name, d, nu=nu, m=favor_features(nu)).out_dim


@pytest.fixture(autouse=True, params=[True, False], ids=["blas", "loops"])
def products(request, monkeypatch):
    if cpu_kernel(torch.zeros(1)) is None:
        pytest.skip("fw_fairseq._cpu is not built")
    if request.param and not cpu_kernel(torch.zeros(1)).feature_attend_blas():
        pytest.skip("the loaded torch exports no BLAS")
    monkeypatch.setattr(cpu_extension, "BLAS", request.param)


def read(rule, name, q, k, v, scalars, nu, causal, norm, pad=None):
    d = q.shape[-1]
    return raw_read.cpu_short_read(name, nu, width(name, d, nu), RULES[rule], q, k, v, scalars, causal, norm, pad,
                                     projection(name, d, nu))


def inputs(B, H, Tq, T, d, M, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, n, w, generator=g, dtype=dtype).requires_grad_() for n, w in ((Tq, d), (T, d), (T, M))]
