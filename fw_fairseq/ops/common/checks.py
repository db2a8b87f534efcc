"""The one check of a tensor argument, for the ops' dispatch (rules/dispatch.py) and the fused read
(fused_read/launch.py): a ValueError of one line naming the op, the argument and what it allows."""
import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_tensor(fn, name, x, shape, sizes=None, like=None, dtypes=FLOAT_DTYPES):
    """x must be a torch.Tensor of shape `shape` (its dims' names, "[B, H, T, M]"), with the sizes `sizes` where
    given (None for a free dim), on the device of like = (its name, the tensor) where given, in one of `dtypes`."""
    dims = shape[1:-1].split(", ")
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{fn}: {name} must be a torch.Tensor of shape {shape}, got {type(x).__name__}")
    if x.dim() != len(dims):
        raise ValueError(f"{fn}: {name} has shape {tuple(x.shape)} (rank {x.dim()}), expected rank {len(dims)}: "
                         f"{shape}")
    if sizes is not None and any(n is not None and n != size for n, size in zip(sizes, x.shape)):
        want = ", ".join(dim if n is None else str(n) for dim, n in zip(dims, sizes))
        raise ValueError(f"{fn}: {name} has shape {tuple(x.shape)}, expected {shape} = [{want}]")
    if like is not None and x.device != like[1].device:
        raise ValueError(f"{fn}: {name} is on {x.device} but {like[0]} is on {like[1].device}; all inputs must share "
                         "a device")
    if x.dtype not in dtypes:
        allowed = ", ".join(str(dtype).replace("torch.", "") for dtype in dtypes)
        raise ValueError(f"{fn}: {name} has dtype {x.dtype}; allowed: {allowed}")
