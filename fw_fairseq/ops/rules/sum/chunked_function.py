"""Autograd function of the chunked causal sum rule, with a hand-written backward.

Letting autograd differentiate the chunk form costs a zero-padded shift, a cumsum along the
(strided) chunk axis and their backward copies — more time than the matmuls on a CPU. Here the
forward saves the scores and the state before every chunk, and the backward is the transposed
chunk form, batched over all chunks (derivation: fw_fairseq/ops/README.md §1, §7):

    forward:  P = tril(Q Kᵀ);  O = P V + Q S_n;  S_{n+1} = S_n + Kᵀ V   (chunk by chunk)
    backward: dP = tril(dO Vᵀ);  G_n = dS_final + Σ_{m>n} Q_mᵀ dO_m  (grad of S_{n+1})
              dQ = dP K + dO S_nᵀ;  dK = dPᵀ Q + V G_nᵀ;  dV = Pᵀ dO + K G_n;  dS_0 = G_0 + Q_0ᵀ dO_0

Shapes, head-major (a plain view of [B, H, T, D] when C divides T): BH = B·H heads, N chunks of C
positions. Q, K [BH, N, C, E]; V [BH, N, C, M]; states [BH, N, E, M]; batched matmuls run on [BH·N, C, D]
views, and the loops over chunks read strided [BH, E, M] slices (no in-place matmul writes into them).
"""
import torch

from fw_fairseq.ops.common.chunk_states import stack_chunk_states, stack_chunks
from fw_fairseq.ops.common.guards import first_order


class ChunkedSum(torch.autograd.Function):
    """(o [BH, N, C, M], final state [BH, E, M] or None) = causal sum rule over chunked inputs."""

    @staticmethod
    def forward(ctx, Q, K, V, S0, need_final, save_for_backward):
        BH, N, C, E = K.shape
        Q_, K_ = Q.view(BH * N, C, E), K.view(BH * N, C, E)
        P = torch.bmm(Q_, K_.transpose(1, 2)).tril_()  # [BHN, C, C], s <= t
        P4 = P.view(BH, N, C, C)
        # Chunk by chunk: O_n = P_n V_n + Q_n S_n, S_{n+1} = S_n + K_nᵀ V_n. Fresh per-chunk results
        # are stacked once; a batched prefix sum over all chunks allocates and touches an extra
        # [BH, N, E, M] buffer, slower on a CPU. The states are stacked only for the backward.
        outs, states = [], []  # per chunk: o [BH, C, M]; kept for backward: S_n [BH, E, M] or None (zero)
        S = S0  # None while the state is still zero
        for n in range(N):
            o = torch.bmm(P4[:, n], V[:, n])
            outs.append(o if S is None else o.baddbmm_(Q[:, n], S))
            if save_for_backward:
                states.append(S)
            if n + 1 < N or need_final:
                write = K[:, n].transpose(1, 2)  # [BH, E, C]
                S = torch.bmm(write, V[:, n]) if S is None else torch.baddbmm(S, write, V[:, n])
        if save_for_backward:
            ctx.save_for_backward(Q, K, V, P, stack_chunk_states(states, K))  # states [BH, N, E, M]
            ctx.has_S0 = S0 is not None
            ctx.set_materialize_grads(False)
        return stack_chunks(outs), (S if need_final else None)

    @staticmethod
    @first_order  # not itself differentiable: double backward fails loudly; autocast off
    def backward(ctx, dO, dS_final):
        Q, K, V, P, states = ctx.saved_tensors
        BH, N, C, E = K.shape
        M = V.shape[-1]
        Q_, K_, V_ = Q.view(BH * N, C, E), K.view(BH * N, C, E), V.view(BH * N, C, M)
        if dO is None:
            dO_ = V_.new_zeros(BH * N, C, M)
        else:
            dO_ = dO.contiguous().view(BH * N, C, M)
        dP = torch.bmm(dO_, V_.transpose(1, 2)).tril_()  # [BHN, C, C]
        dQ = torch.bmm(dP, K_)  # [BHN, C, E]
        dK = torch.bmm(dP.transpose(1, 2), Q_)  # [BHN, C, E]
        dV = torch.bmm(P.transpose(1, 2), dO_)  # [BHN, C, M]
        dS0 = None
        if states is not None:
            dQ.baddbmm_(dO_, states.view(BH * N, E, M).transpose(1, 2))
            reads = torch.bmm(Q_.transpose(1, 2), dO_).view(BH, N, E, M)  # Q_nᵀ dO_n, grad of S_n from O
            grad_after = torch.empty_like(reads)  # [BH, N, E, M], G_n: grad of the state after chunk n
            if dS_final is None:
                grad_after[:, -1].zero_()
            else:
                grad_after[:, -1].copy_(dS_final)
            for n in range(N - 1, 0, -1):
                torch.add(grad_after[:, n], reads[:, n], out=grad_after[:, n - 1])
            dS0 = grad_after[:, 0] + reads[:, 0] if ctx.has_S0 else None
        elif dS_final is not None:
            grad_after = dS_final  # one chunk: [BH, E, M]
        else:
            grad_after = None
        if grad_after is not None:
            grad_after_ = grad_after.reshape(BH * N, E, M)
            dK.baddbmm_(V_, grad_after_.transpose(1, 2))
            dV.baddbmm_(K_, grad_after_)
        return dQ.view(BH, N, C, E), dK.view(BH, N, C, E), dV.view(BH, N, C, M), dS0, None, None
