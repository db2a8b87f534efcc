"""Autograd function of the chunked causal delta rule (UT form), with a hand-written backward.

Forward (fw_fairseq/ops/README.md §2), per chunk n with S_n the state before it:

    X = tril(K Kᵀ, −1);  T = (I + diag(β) X)⁻¹;  T_β = T diag(β);  P = tril(Q Kᵀ)   (all chunks at once)
    r = V − K S_n;  u = T_β r;  O = P u + Q S_n;  S_{n+1} = S_n + Kᵀ u            (chunk by chunk)

u = T_β (V − K S_n) is the WY form's U − W S_n without forming W = T_β K and U = T_β V: one more
small matmul per chunk in the loop, but two batched [C, C] x [C, E|M] products fewer, which is
faster on a CPU. The backward (README §7) runs the recurrence in reverse with G_n, the gradient
of S_{n+1}:

    du = tril(Q Kᵀ)ᵀ dO + K G_n;   dr = T_βᵀ du;   G_{n−1} = G_n + Qᵀ dO − Kᵀ dr
then, batched over chunks: dV = dr; dK = u G_nᵀ − dr S_nᵀ + tril(dO uᵀ)ᵀ Q + (dX + dXᵀ) K;
dQ = tril(dO uᵀ) K + dO S_nᵀ; and through the UT transform, with dT_β = du rᵀ:
    dT = dT_β diag(β);  dβ = colsum(dT_β ⊙ T) + rowsum(dL ⊙ X);  dL = −tril(Tᵀ dT Tᵀ, −1);  dX = diag(β) dL

Shapes, head-major (a plain view of [B, H, T, D] when C divides T): G = B·H heads, N chunks of C
positions. Q, K [G, N, C, E]; V [G, N, C, M]; beta [G, N, C]; states [G, N, E, M]; batched matmuls
run on [G·N, C, D] views. The loops only read strided [G, C, D] slices and collect fresh per-chunk
results, stacked once afterwards (in-place matmuls into strided slices take a slow path);
u, r and the states are stacked and kept only when a backward will follow (save_for_backward):
filling fresh buffers costs about as much as the loop's matmuls on a CPU.
Q may be None (a pure write: fast_weight_write). Saved for backward: the inputs, X, T, u, r, the
scores and one state per chunk — O(N E M + T (E + M + C)) per head.
"""
import torch

from .chunk_states import stack_chunk_states
from .guards import first_order

_INVERSE_BLOCK = 8  # diagonal blocks solved directly; 8 was fastest for C = 32 and 64 on a CPU (vs 4, 16, 32)


def unit_lower_inverse_(L):
    """(I + L)⁻¹ for strictly lower triangular L [..., C, C], written over L (which must be contiguous
    and is consumed: a fresh [..., C, C] buffer costs as much as the arithmetic on a CPU).

    Block forward substitution: the diagonal blocks (at most _INVERSE_BLOCK wide) are inverted by one
    batched triangular solve, then block row i is T_i,<i = −T_ii (L_i,<i T_<i,<i), which reads only
    L's block row i and the rows of T above it, so T can replace L row block by row block. A direct
    solve against an identity costs several times more for C = 32..64 on a CPU.
    """
    C = L.shape[-1]
    n_blocks = -(-C // _INVERSE_BLOCK)
    b = -(-C // n_blocks)  # equal blocks of at most _INVERSE_BLOCK; C is padded up to n_blocks * b
    padded = n_blocks * b
    eye = torch.eye(b, dtype=L.dtype, device=L.device)
    if n_blocks == 1:
        return torch.linalg.solve_triangular(L + eye, eye.expand_as(L), upper=False, unitriangular=True)
    if padded != C:
        L = torch.nn.functional.pad(L, (0, padded - C, 0, padded - C))
    T = L.flatten(0, -3)  # [G, C', C'] (a view), L becoming T in place
    G = T.shape[0]
    T_diag = T.as_strided((G, n_blocks, b, b), (padded * padded, b * padded + b, padded, 1))  # [G, n_blocks, b, b]
    T_diag.copy_(torch.linalg.solve_triangular(T_diag + eye, eye.expand(G, n_blocks, b, b),
                                               upper=False, unitriangular=True))
    for i in range(1, n_blocks):
        rows, done = slice(i * b, (i + 1) * b), i * b
        T[:, rows, :done] = -torch.bmm(T_diag[:, i], torch.bmm(T[:, rows, :done], T[:, :done, :done]))
    return L[..., :C, :C]


class ChunkedDelta(torch.autograd.Function):
    """(o [G, N, C, M] or None, final state [G, E, M] or None) = causal delta rule over chunks."""

    @staticmethod
    def forward(ctx, Q, K, V, beta, S0, need_final, save_for_backward):
        G, N, C, E = K.shape
        K_, b = K.view(G * N, C, E), beta.view(G * N, C, 1)
        X = torch.bmm(K_, K_.transpose(1, 2)).tril_(-1)  # [GN, C, C], k_t . k_s for s < t
        # without a backward X and T are not needed once scaled: scale them in place (fewer fresh buffers)
        L = X * b if save_for_backward else X.mul_(b)  # diag(beta) X
        T = unit_lower_inverse_(L)  # [GN, C, C], over L
        Tb = T * b.transpose(1, 2) if save_for_backward else T.mul_(b.transpose(1, 2))  # T diag(beta)
        Tb = Tb.view(G, N, C, C)
        P = None if Q is None else torch.bmm(Q.view(G * N, C, E), K_.transpose(1, 2)).tril_()  # [GN, C, C], s <= t
        P4 = None if P is None else P.view(G, N, C, C)
        outs, rs, us, states = [], [], [], []  # per chunk: o, r, u [G, C, M]; S_n [G, E, M] or None (zero)
        S = S0  # None while the state is still zero
        for n in range(N):
            r = V[:, n] if S is None else torch.baddbmm(V[:, n], K[:, n], S, alpha=-1)  # V − K S_n
            u = torch.bmm(Tb[:, n], r)
            if Q is not None:  # O = tril(Q Kᵀ) u + Q S_n
                o = torch.bmm(P4[:, n], u)
                outs.append(o if S is None else o.baddbmm_(Q[:, n], S))
            if save_for_backward:
                rs.append(r)
                us.append(u)
                states.append(S)
            if n + 1 < N or need_final:
                write = K[:, n].transpose(1, 2)  # [G, E, C]
                S = torch.bmm(write, u) if S is None else torch.baddbmm(S, write, u)
        o = None if Q is None else torch.stack(outs, 1)  # [G, N, C, M]
        if save_for_backward:
            u, r = torch.stack(us, 1), torch.stack(rs, 1)  # [G, N, C, M]
            ctx.save_for_backward(Q, K, beta, X, T, u, r, P, stack_chunk_states(states, K))  # states [G, N, E, M]
            ctx.has_S0 = S0 is not None
            ctx.set_materialize_grads(False)
        return o, (S if need_final else None)

    @staticmethod
    @first_order  # not itself differentiable: double backward fails loudly; autocast off
    def backward(ctx, dO, dS_final):
        Q, K, beta, X, T, u, r, P, states = ctx.saved_tensors
        G, N, C, E = K.shape
        M = u.shape[-1]
        GN = G * N
        K_, u_, b = K.view(GN, C, E), u.view(GN, C, M), beta.view(GN, C, 1)
        Tb = (T * b.transpose(1, 2)).view(G, N, C, C)
        dO_ = None if dO is None or Q is None else dO.contiguous().view(GN, C, M)
        out_du = None if dO_ is None else torch.bmm(P.transpose(1, 2), dO_).view(G, N, C, M)  # from O
        reads = None  # Q_nᵀ dO_n, the output's gradient of S_n
        if dO_ is not None and states is not None:
            reads = torch.bmm(Q.view(GN, C, E).transpose(1, 2), dO_).view(G, N, E, M)
        Gn = K.new_zeros(G, E, M) if dS_final is None else dS_final  # G_n, the gradient of S_{n+1}
        grads_after, dus, drs = [], [], []  # per chunk, collected last to first
        for n in range(N - 1, -1, -1):
            grads_after.append(Gn)
            du = torch.bmm(K[:, n], Gn) if out_du is None else torch.baddbmm(out_du[:, n], K[:, n], Gn)
            dr = torch.bmm(Tb[:, n].transpose(1, 2), du)
            dus.append(du)
            drs.append(dr)
            if n == 0 and not ctx.has_S0:
                break  # the gradient of a zero initial state is not needed
            Gn = torch.baddbmm(Gn if reads is None else Gn + reads[:, n], K[:, n].transpose(1, 2), dr, alpha=-1)
        dS0 = Gn if ctx.has_S0 else None
        grad_after, du, dr = (torch.stack(x[::-1], 1) for x in (grads_after, dus, drs))  # [G, N, ...]
        du_, dr_ = du.view(GN, C, M), dr.view(GN, C, M)

        dK = torch.bmm(u_, grad_after.view(GN, E, M).transpose(1, 2))  # [GN, C, E], from S_{n+1} = S_n + Kᵀ u
        if states is not None:  # from r = V − K S_n
            dK.baddbmm_(dr_, states.view(GN, E, M).transpose(1, 2), alpha=-1)
        dQ = None
        if dO_ is not None:
            dP = torch.bmm(dO_, u_.transpose(1, 2)).tril_()  # [GN, C, C]
            dQ = torch.bmm(dP, K_)
            dK.baddbmm_(dP.transpose(1, 2), Q.view(GN, C, E))
            if states is not None:
                dQ.baddbmm_(dO_, states.view(GN, E, M).transpose(1, 2))
            dQ = dQ.view(G, N, C, E)
        # the [GN, C, C] temporaries below reuse two buffers: fresh ones cost as much as the matmuls on a CPU
        dTb = torch.bmm(du_, r.view(GN, C, M).transpose(1, 2))  # [GN, C, C]
        product = dTb * T
        dbeta = product.sum(1)  # [GN, C], column sums of dT_β ⊙ T
        dT = dTb.mul_(b.transpose(1, 2))
        Tt = T.transpose(1, 2)
        dL = torch.bmm(torch.bmm(Tt, dT), Tt, out=dT).neg_().tril_(-1)  # [GN, C, C], over dT
        dbeta += torch.mul(dL, X, out=product).sum(2)  # row sums of dL ⊙ X
        dX = dL.mul_(b)
        dK.baddbmm_(dX + dX.transpose(1, 2), K_)
        return dQ, dK.view(G, N, C, E), dr, dbeta.view(G, N, C), dS0, None, None
