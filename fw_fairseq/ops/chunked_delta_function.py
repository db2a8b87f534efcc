"""Autograd function of the chunked causal delta rule (WY/UT form), with a hand-written backward.

Forward (fw_fairseq/ops/README.md §2), per chunk n with S_n the state before it:

    X = tril(K Kᵀ, −1);  T = (I + diag(β) X)⁻¹;  T_β = T diag(β);  W = T_β K;  U = T_β V
    u = U − W S_n;  S_{n+1} = S_n + Kᵀ u;  O = Q S_n + tril(Q Kᵀ) u

β scales the [C, C] matrices, not the [C, E] keys and [C, M] values. Only the two state matmuls per
chunk are sequential; everything else is batched over all chunks. The backward (README §7) runs
the recurrence in reverse with G_n, the gradient of the state after chunk n:

    du = tril(Q Kᵀ)ᵀ dO + K G_n;   G_{n−1} = G_n + Qᵀ dO − Wᵀ du
then, batched over chunks: dQ = tril(dO uᵀ) K + dO S_nᵀ; dK = tril(dO uᵀ)ᵀ Q + u G_nᵀ + ...;
dW = −du S_nᵀ; dU = du; and through the UT transform:
    dT_β = dW Kᵀ + dU Vᵀ;  dK += T_βᵀ dW;  dV = T_βᵀ dU;  dT = dT_β diag(β);  dβ = colsum(dT_β ⊙ T)
    dL = −tril(Tᵀ dT Tᵀ, −1) for L = diag(β) X;  dβ += rowsum(dL ⊙ X);  dX = diag(β) dL;  dK += (dX + dXᵀ) K

Shapes, chunk-major so that one chunk's slice is contiguous: N chunks of C positions, G = B·H heads.
Q, K [N, G, C, E]; V [N, G, C, M]; beta [N, G, C]; states [N, G, E, M]; batched matmuls run on
[N·G, C, D] views. Q may be None (a pure write: fast_weight_write). Saved for backward: the inputs,
T, W, u, the scores and one state per chunk — O(N E M + T (E + M + C)) per head.
"""
import torch

_INVERSE_BLOCK = 16  # LAPACK's batched triangular solve is fast up to about this size


def unit_lower_inverse(L):
    """(I + L)⁻¹ for strictly lower triangular L [..., C, C].

    Block forward substitution: the diagonal blocks (at most _INVERSE_BLOCK wide) are inverted by one
    batched triangular solve, then block row i below them is T_i,<i = −T_ii (L_i,<i T_<i,<i).
    A direct solve against an identity costs several times more for C = 32..64 on a CPU.
    """
    C = L.shape[-1]
    n_blocks = -(-C // _INVERSE_BLOCK)
    b = -(-C // n_blocks)  # equal blocks of at most _INVERSE_BLOCK; C is padded up to n_blocks * b
    padded = n_blocks * b
    eye = torch.eye(b, dtype=L.dtype, device=L.device)
    if n_blocks == 1:
        return torch.linalg.solve_triangular(L + eye, eye.expand_as(L), upper=False, unitriangular=True)
    Lf = torch.nn.functional.pad(L, (0, padded - C, 0, padded - C)).reshape(-1, padded, padded)  # [G, C', C']
    G = Lf.shape[0]
    diagonal = (G, n_blocks, b, b), (padded * padded, b * padded + b, padded, 1)  # the diagonal blocks as a view
    T = torch.zeros_like(Lf)
    T_diag = T.as_strided(*diagonal)  # [G, n_blocks, b, b]
    T_diag.copy_(torch.linalg.solve_triangular(Lf.as_strided(*diagonal) + eye, eye.expand(G, n_blocks, b, b),
                                               upper=False, unitriangular=True))
    for i in range(1, n_blocks):
        rows, done = slice(i * b, (i + 1) * b), i * b
        T[:, rows, :done] = -torch.bmm(T_diag[:, i], torch.bmm(Lf[:, rows, :done], T[:, :done, :done]))
    return T.view(*L.shape[:-2], padded, padded)[..., :C, :C]


class ChunkedDelta(torch.autograd.Function):
    """(o [N, G, C, M] or None, final state [G, E, M] or None) = causal delta rule over chunks."""

    @staticmethod
    def forward(ctx, Q, K, V, beta, S0, need_final):
        N, G, C, E = K.shape
        M = V.shape[-1]
        K_, V_, b = K.view(N * G, C, E), V.view(N * G, C, M), beta.view(N * G, C, 1)
        X = torch.bmm(K_, K_.transpose(1, 2)).tril_(-1)  # [NG, C, C], k_t . k_s for s < t
        T = unit_lower_inverse(X * b)  # [NG, C, C]
        Tb = T * b.transpose(1, 2)  # [NG, C, C], T diag(beta)
        u = torch.bmm(Tb, V_).view(N, G, C, M)  # U, turned into the effective writes u in place
        # W only ever multiplies a nonzero state: one chunk with no initial state needs U alone
        carries_state = N > 1 or S0 is not None
        W = torch.bmm(Tb, K_).view(N, G, C, E) if carries_state else None
        states = torch.empty(N, G, E, M, dtype=K.dtype, device=K.device) if carries_state else None
        S = S0  # None while the state is still zero
        for n in range(N):
            if carries_state:
                if S is None:
                    states[n].zero_()
                else:
                    if n == 0:
                        states[0].copy_(S)
                    u[n].baddbmm_(W[n], S, alpha=-1)  # u = U − W S_n
            if n + 1 < N or need_final:
                write = K[n].transpose(1, 2)  # [G, E, C]
                out = states[n + 1] if n + 1 < N else None  # the next chunk's state, written in place
                S = torch.bmm(write, u[n], out=out) if S is None else torch.baddbmm(S, write, u[n], out=out)
        o = P = None
        if Q is not None:
            Q_, u_ = Q.view(N * G, C, E), u.view(N * G, C, M)
            P = torch.bmm(Q_, K_.transpose(1, 2)).tril_()  # [NG, C, C], s <= t
            o = torch.bmm(P, u_)
            if carries_state:
                o.baddbmm_(Q_, states.view(N * G, E, M))
            o = o.view(N, G, C, M)
        ctx.save_for_backward(Q, K, V, beta, X, T, W, u, P, states)
        ctx.has_S0 = S0 is not None
        ctx.set_materialize_grads(False)
        return o, (S if need_final else None)

    @staticmethod
    def backward(ctx, dO, dS_final):
        Q, K, V, beta, X, T, W, u, P, states = ctx.saved_tensors
        N, G, C, E = K.shape
        M = V.shape[-1]
        NG = N * G
        K_, V_, u_, b = K.view(NG, C, E), V.view(NG, C, M), u.view(NG, C, M), beta.view(NG, C, 1)
        dO_ = None if dO is None or Q is None else dO.contiguous().view(NG, C, M)
        # du starts as its output term tril(Q Kᵀ)ᵀ dO; the loop adds the state term K G_n
        du = V_.new_zeros(NG, C, M) if dO_ is None else torch.bmm(P.transpose(1, 2), dO_)
        du4 = du.view(N, G, C, M)
        reads = None
        if dO_ is not None and states is not None:  # Q_nᵀ dO_n: the output's gradient of S_n
            reads = torch.bmm(Q.view(NG, C, E).transpose(1, 2), dO_).view(N, G, E, M)
        grad_after = torch.empty(N, G, E, M, dtype=K.dtype, device=K.device)  # G_n per chunk
        if dS_final is None:
            grad_after[-1].zero_()
        else:
            grad_after[-1].copy_(dS_final)
        for n in range(N - 1, -1, -1):
            du4[n].baddbmm_(K[n], grad_after[n])
            if n == 0 and not ctx.has_S0:
                break  # the gradient of a zero initial state is not needed
            # G_{n−1} = G_n + Qᵀ dO − Wᵀ du, written straight into its slot (W exists: N > 1 or S0 given)
            dS = grad_after[n - 1] if n else torch.empty_like(grad_after[0])
            if reads is None:
                dS.copy_(grad_after[n])
            else:
                torch.add(grad_after[n], reads[n], out=dS)
            dS.baddbmm_(W[n].transpose(1, 2), du4[n], alpha=-1)
        dS0 = dS if ctx.has_S0 else None

        dK = torch.bmm(u_, grad_after.view(NG, E, M).transpose(1, 2))  # [NG, C, E], from S_{n+1} = S_n + Kᵀ u
        dQ = None
        if dO_ is not None:
            dP = torch.bmm(dO_, u_.transpose(1, 2)).tril_()  # [NG, C, C]
            Q_ = Q.view(NG, C, E)
            dQ = torch.bmm(dP, K_)
            dK.baddbmm_(dP.transpose(1, 2), Q_)
            if states is not None:
                dQ.baddbmm_(dO_, states.view(NG, E, M).transpose(1, 2))
            dQ = dQ.view(N, G, C, E)
        Tb = T * b.transpose(1, 2)
        dTb = torch.bmm(du, V_.transpose(1, 2))  # [NG, C, C]
        dV = torch.bmm(Tb.transpose(1, 2), du)  # [NG, C, M]
        if W is not None:
            dW = torch.bmm(du, states.view(NG, E, M).transpose(1, 2)).neg_()  # [NG, C, E]
            dTb.baddbmm_(dW, K_.transpose(1, 2))
            dK.baddbmm_(Tb.transpose(1, 2), dW)
        dbeta = (dTb * T).sum(1)  # [NG, C], column sums
        dT = dTb * b.transpose(1, 2)
        Tt = T.transpose(1, 2)
        dL = torch.bmm(torch.bmm(Tt, dT), Tt).neg_().tril_(-1)  # [NG, C, C]
        dbeta += (dL * X).sum(2)  # row sums
        dX = dL * b
        dK.baddbmm_(dX + dX.transpose(1, 2), K_)
        return dQ, dK.view(N, G, C, E), dV.view(N, G, C, M), dbeta.view(N, G, C), dS0, None
