"""Learned feature maps, for turning a trained softmax Transformer into a fast-weight one (docs/converting.md).

Both hold per-head parameters, so they act on head-first inputs [..., H, T, d] (the attention module's layout
everywhere: training, the decoding cache, the source memory) and check that dim -3 is their H. Neither has a
row form for the CPU kernels or the fused GPU read (kernel_map None): every read of theirs runs the PyTorch forms.

- T2r (Kasai et al. 2021): phi(x) = relu(W x + b), W [K, d] per head, E = K. Per head, not shared per layer: the
  teacher's heads attend with different patterns (that is what distillation fits), and a head's map costs K d
  weights, little beside its layer's C x C projections. W starts as a Gaussian random-feature draw scaled by
  d^-1/2 and b at 0 (relu random features, Choromanski et al. 2021), the parameter-free map distillation moves.
- TrainableHedgehog (Zhang et al. 2024): phi(x) = [softmax(W x + b), softmax(-(W x + b))], W [d, d] per head,
  starting at the identity with b = 0, so that it starts as the fixed Hedgehog map.
"""
import torch
import torch.nn.functional as F
from torch import nn

from fw_fairseq.ops.maps.feature_maps import FeatureMap, Hedgehog


def _check_count(owner, name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{owner}: {name}={value!r} is not allowed; it must be an int >= 1")


class _PerHeadLinear(nn.Module):
    """x [..., H, T, d_in] -> x W_h^T + b_h [..., H, T, d_out], one (W_h [d_out, d_in], b_h [d_out]) per head."""

    def __init__(self, owner, heads, d_in, d_out):
        super().__init__()
        _check_count(owner, "heads", heads)
        self.owner = owner
        self.weight = nn.Parameter(torch.empty(heads, d_out, d_in))
        self.bias = nn.Parameter(torch.zeros(heads, d_out))

    def project(self, x):
        heads = self.weight.shape[0]
        if x.dim() < 3 or x.shape[-3] != heads:
            raise ValueError(f"{self.owner}: input of shape {tuple(x.shape)} has no head dim of {heads} at dim -3; "
                             f"allowed: [..., {heads}, T, d]")
        w, b = self.weight.to(x.dtype), self.bias.to(x.dtype)  # fp16 weights under --fp16, the heads in fp32
        return x @ w.transpose(-1, -2) + b[:, None, :]  # [..., H, T, d] @ [H, d, d_out] -> [..., H, T, d_out]


class T2r(FeatureMap):
    """phi(x) = relu(W_h x + b_h) per head h, E = K (--fw-t2r-features)."""

    def __init__(self, d_key, heads, features):
        super().__init__(d_key)
        _check_count("T2r", "features", features)
        self.features = features
        self.linear = _PerHeadLinear("T2r", heads, d_key, features)
        with torch.no_grad():
            self.linear.weight.normal_(0.0, d_key ** -0.5)

    def extra_repr(self):
        return f"d_key={self.d_key}, heads={self.linear.weight.shape[0]}, features={self.features}"

    @property
    def out_dim(self):
        return self.features

    def forward(self, x, is_query):
        return F.relu(self.linear.project(x))  # [..., H, T, K]


class TrainableHedgehog(Hedgehog):
    """Hedgehog after a per-head d x d linear layer (identity at the start), E = 2 d."""

    kernel_map = None  # the layer comes first: the kernels' row form is the fixed map's only

    def __init__(self, d_key, heads):
        super().__init__(d_key)
        self.linear = _PerHeadLinear("TrainableHedgehog", heads, d_key, d_key)
        with torch.no_grad():
            self.linear.weight.copy_(torch.eye(d_key).expand(heads, d_key, d_key))

    def forward(self, x, is_query):
        return super().forward(self.linear.project(x), is_query)  # [..., H, T, 2 d]
