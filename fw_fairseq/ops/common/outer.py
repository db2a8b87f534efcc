"""The small products the rules' T = 1 steps share (rules/<rule>/step.py)."""
import torch


def add_outer(S0, k, u):
    """S0 + k^T u over [B, H] in one fused baddbmm (no temporary [B, H, E, M] outer product).

    S0 [B, H, E, M] or None; k [B, H, 1, E]; u [B, H, 1, M] -> [B, H, E, M]."""
    (B, H, _, E), M = k.shape, u.shape[-1]
    kt, ut = k.reshape(B * H, 1, E).transpose(1, 2), u.reshape(B * H, 1, M)  # [BH, E, 1], [BH, 1, M]
    if S0 is None:
        return (kt @ ut).view(B, H, E, M)
    return torch.baddbmm(S0.reshape(B * H, E, M), kt, ut).view(B, H, E, M)


def add_outer_(state, k, u):
    """state += k^T u in place: state [B, H, E, M] viewed as [B H, E, M] += [B H, E, 1] @ [B H, 1, M]."""
    (B, H, _, E), M = k.shape, u.shape[-1]
    state.view(B * H, E, M).baddbmm_(k.reshape(B * H, 1, E).transpose(1, 2), u.reshape(B * H, 1, M))


def cast(dtype, initial_state, *tensors):
    """The tensors and the initial state (None stays None) in dtype."""
    return [x.to(dtype) for x in tensors] + [None if initial_state is None else initial_state.to(dtype)]
