"""The sum rule's record: W_t = W_{t-1} + phi(k_t) v_t^T; o_t = W_t^T phi(q_t), normalised through the z column
(the values carry a ones column, the state's last column is z = sum phi(k)). No per-position scalars."""
import torch

from fw_fairseq.ops.common.guards import state_dtype
from fw_fairseq.ops.rules.sum.fused import sum_fused, sum_fused_aligned
from fw_fairseq.ops.rules.sum.short_read import sum_short_read
from fw_fairseq.ops.rules.record import UpdateRule
from fw_fairseq.ops.rules.sum.chunked import chunked_sum
from fw_fairseq.ops.rules.sum.naive import naive_sum
from fw_fairseq.ops.rules.sum.step import in_place_step_sum, step_sum


def sum_memory(k, v):
    """sum_t k_t^T v_t, one einsum in the state dtype: k [B, H, T, E], v [B, H, T, M] -> [B, H, E, M]."""
    dtype = state_dtype(k.dtype)
    return torch.einsum("bhte,bhtm->bhem", k.to(dtype), v.to(dtype))


def sum_writes(phi_k, v):
    """The sum rule's effective writes are its values: u_s = v_s."""
    return v


def sum_write_of(v, key_read):
    """One position's effective write: its value (the rule reads nothing at the key)."""
    return v


def sum_kernel_scalars():
    """The CPU decoding kernels take the sum rule as no beta and no alpha."""
    return None, None


SUM = UpdateRule(
    name="sum", scalars=(), pad_values={}, normalised_phi=False, z_column=True,
    naive=naive_sum, chunked=chunked_sum, step=step_sum, memory=sum_memory, writes=sum_writes, short_with_grad=True,
    key_reads=False, write_of=sum_write_of, in_place_step=in_place_step_sum,
    kernel="sum", kernel_memory=False, kernel_scalars=sum_kernel_scalars, fused=sum_fused,
    fused_aligned=sum_fused_aligned, short=sum_short_read,
)
