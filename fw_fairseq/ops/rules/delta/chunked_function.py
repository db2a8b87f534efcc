"""Autograd function of the chunked causal (gated) delta rule (UT form), with a hand-written backward.

Forward (fw_fairseq/ops/README.md §2, §8), per chunk n with S_n the state before it; the gated rule
(g, the cumulative log-gates, given) decays through ChunkGates: pair = exp(g_t − g_s),
read = exp(g_t), write = exp(g_C − g_t), chunk = exp(g_C); the delta rule (g None) has all four = 1
and skips them (fla's one core with g=None):

    X = tril(K Kᵀ, −1) ⊙ pair;  T = (I + diag(β) X)⁻¹;  T_β = T diag(β);  P = tril(Q Kᵀ) ⊙ pair
                                                                               (all chunks at once)
    r = V − (read·K) S_n;  u = T_β r;  O = P u + (read·Q) S_n;  S_{n+1} = chunk·S_n + (write·K)ᵀ u
                                                                               (chunk by chunk)

u = T_β (V − K S_n) is the WY form's U − W S_n without forming W = T_β K and U = T_β V: one more
small matmul per chunk in the loop, but two batched [C, C] x [C, E|M] products fewer, which is
faster on a CPU. The backward (README §7, §8) runs the recurrence in reverse with G_n, the gradient
of S_{n+1}:

    du = Pᵀ dO + (write·K) G_n;   dr = T_βᵀ du;   G_{n−1} = chunk·G_n + (read·Q)ᵀ dO − (read·K)ᵀ dr
then, batched over chunks: dV = dr; dK = u G_nᵀ − dr S_nᵀ + tril(dO uᵀ)ᵀ Q + (dX + dXᵀ) K;
dQ = tril(dO uᵀ) K + dO S_nᵀ (the gated rule's scaled forms: chunk_gates.gated_backward_terms);
and through the UT transform, with dT_β = du rᵀ:
    dT = dT_β diag(β);  dβ = colsum(dT_β ⊙ T) + rowsum(dL ⊙ X);
    dL = −tril(Tᵀ dT Tᵀ, −1);  dX = diag(β) dL

Shapes, head-major (a plain view of [B, H, T, D] when C divides T): BH = B·H heads, N chunks of C
positions. Q, K [BH, N, C, E]; V [BH, N, C, M]; beta, g [BH, N, C]; states [BH, N, E, M]; batched
matmuls run on [BH·N, C, D] views. The loops only read strided [BH, C, D] slices and collect fresh
per-chunk results, stacked once afterwards (in-place matmuls into strided slices take a slow path);
u, r and the states are stacked and kept only when a backward will follow (save_for_backward):
filling fresh buffers costs about as much as the loop's matmuls on a CPU.
Q may be None (a pure write: fast_weight_write). Saved for backward: the inputs, X, T, u, r, the
scores and one state per chunk — O(N E M + T (E + M + C)) per head.
"""
import torch

from fw_fairseq.ops.rules.delta.chunk_gates import ChunkGates, gated_backward_terms
from fw_fairseq.ops.common.chunk_states import stack_chunk_states, stack_chunks
from fw_fairseq.ops.common.guards import first_order

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
    T = L.flatten(0, -3)  # [batch, C', C'] (a view), L becoming T in place
    batch = T.shape[0]
    T_diag = T.as_strided((batch, n_blocks, b, b), (padded * padded, b * padded + b, padded, 1))  # [batch, n_blocks, b, b]
    T_diag.copy_(torch.linalg.solve_triangular(T_diag + eye, eye.expand(batch, n_blocks, b, b),
                                               upper=False, unitriangular=True))
    for i in range(1, n_blocks):
        rows, done = slice(i * b, (i + 1) * b), i * b
        T[:, rows, :done] = -torch.bmm(T_diag[:, i], torch.bmm(T[:, rows, :done], T[:, :done, :done]))
    return L[..., :C, :C]


def _add_bmm(acc, a, b, alpha=1):
    """acc + alpha (a @ b) for batched matrices, written into acc; acc None stands for zero."""
    if acc is None:
        product = torch.bmm(a, b)
        return product if alpha == 1 else product.mul_(alpha)
    return acc.baddbmm_(a, b, alpha=alpha)


class ChunkedDelta(torch.autograd.Function):
    """(o [BH, N, C, M] or None, final state [BH, E, M] or None) = causal (gated) delta rule over chunks."""

    @staticmethod
    def forward(ctx, Q, K, V, beta, g, S0, need_final, save_for_backward):
        BH, N, C, E = K.shape
        K_, b = K.view(BH * N, C, E), beta.view(BH * N, C, 1)
        gates = None if g is None else ChunkGates(g)
        X = torch.bmm(K_, K_.transpose(1, 2)).tril_(-1)  # [BHN, C, C], k_t . k_s for s < t
        if gates is not None:
            X.mul_(gates.pair)
        # without a backward X and T are not needed once scaled: scale them in place (fewer fresh buffers)
        L = X * b if save_for_backward else X.mul_(b)  # diag(beta) X
        T = unit_lower_inverse_(L)  # [BHN, C, C], over L
        Tb = T * b.transpose(1, 2) if save_for_backward else T.mul_(b.transpose(1, 2))  # T diag(beta)
        Tb = Tb.view(BH, N, C, C)
        P = None if Q is None else torch.bmm(Q.view(BH * N, C, E), K_.transpose(1, 2)).tril_()  # [BHN, C, C], s <= t
        if P is not None and gates is not None:
            P.mul_(gates.pair)
        P4 = None if P is None else P.view(BH, N, C, C)
        # the keys and queries that meet the state before the chunk, and the keys that write to the next
        K_read, K_write, Q_read = K, K, Q  # [BH, N, C, E]
        if gates is not None:
            K_read, K_write = K * gates.read, K * gates.write
            Q_read = None if Q is None else Q * gates.read
        outs, rs, us, states = [], [], [], []  # per chunk: o, r, u [BH, C, M]; S_n [BH, E, M] or None (zero)
        S = S0  # None while the state is still zero
        for n in range(N):
            r = V[:, n] if S is None else torch.baddbmm(V[:, n], K_read[:, n], S, alpha=-1)  # V − K S_n
            u = torch.bmm(Tb[:, n], r)
            if Q is not None:  # O = tril(Q Kᵀ) u + Q S_n
                o = torch.bmm(P4[:, n], u)
                outs.append(o if S is None else o.baddbmm_(Q_read[:, n], S))
            if save_for_backward:
                rs.append(r)
                us.append(u)
                states.append(S)
            if n + 1 < N or need_final:
                write = K_write[:, n].transpose(1, 2)  # [BH, E, C]
                if S is not None and gates is not None:
                    S = S * gates.chunk[:, n]
                S = torch.bmm(write, u) if S is None else torch.baddbmm(S, write, u)
        o = None if Q is None else stack_chunks(outs)  # [BH, N, C, M]
        if save_for_backward:
            u, r = stack_chunks(us), stack_chunks(rs)  # [BH, N, C, M]
            # states [BH, N, E, M]
            ctx.save_for_backward(Q, K, beta, g, X, T, u, r, P, stack_chunk_states(states, K))
            ctx.has_S0 = S0 is not None
            ctx.set_materialize_grads(False)
        return o, (S if need_final else None)

    @staticmethod
    @first_order  # not itself differentiable: double backward fails loudly; autocast off
    def backward(ctx, dO, dS_final):
        Q, K, beta, g, X, T, u, r, P, states = ctx.saved_tensors
        if (dO is None or Q is None) and dS_final is None:
            return (None,) * 8  # neither output's gradient reached the op: every input's is zero
        BH, N, C, E = K.shape
        M = u.shape[-1]
        gates = None if g is None else ChunkGates(g)
        dO_ = None if dO is None or Q is None else dO.contiguous().view(BH * N, C, M)  # [BHN, C, M]
        du, dr, grad_after, dS0 = _reverse_pass(ctx.has_S0, Q, K, beta, T, P, states, gates, dO_, dS_final)
        dQ, dK, dK_read, dQ_read, dP = _read_gradients(Q, K, u, states, gates, dO_, dr, grad_after)
        dbeta, dX = _solve_gradients(X, T, beta, r, du)
        dg = None
        K_, Q_ = K.view(BH * N, C, E), None if Q is None else Q.view(BH * N, C, E)
        if gates is None:
            dK = _add_bmm(dK, dX + dX.transpose(1, 2), K_)
        else:
            dK_write = K_.new_zeros(BH * N, C, E) if dK is None else dK
            dK, dQ, dg = gated_backward_terms(gates, K_, Q_, dK_write, dK_read, dQ_read, dP, P, dX, X)
            if states is not None and grad_after is not None:  # S_{n+1} = exp(g_C) S_n + ...
                dg[:, -1] += gates.chunk.view(BH * N) * (grad_after * states).sum((2, 3)).view(BH * N)
            dg = dg.view(BH, N, C)
        dQ = None if dQ is None else dQ.view(BH, N, C, E)
        return dQ, dK.view(BH, N, C, E), dr, dbeta.view(BH, N, C), dg, dS0, None, None


def _reverse_pass(has_S0, Q, K, beta, T, P, states, gates, dO_, dS_final):
    """The chunks last to first: the gradients of each chunk's writes u and residuals r ([BH, N, C, M]), of the
    state after each chunk (G_n [BH, N, E, M], None where all are zero) and of the initial state (or None)."""
    BH, N, C, E = K.shape
    BHN = BH * N
    K_read, K_write, Q_read = K, K, None if Q is None else Q.view(BHN, C, E)  # as in the forward
    if gates is not None:
        K_read, K_write = K * gates.read, K * gates.write
        Q_read = None if Q is None else Q_read * gates.read.view(BHN, C, 1)
    Tb = (T * beta.view(BHN, 1, C)).view(BH, N, C, C)  # T_beta = T diag(beta)
    M = None if dO_ is None else dO_.shape[-1]
    out_du = None if dO_ is None else torch.bmm(P.transpose(1, 2), dO_).view(BH, N, C, M)  # from O
    reads = None  # Q_nᵀ dO_n, the output's gradient of S_n
    if dO_ is not None and states is not None:
        reads = torch.bmm(Q_read.transpose(1, 2), dO_).view(BH, N, E, M)
    # G_n, the gradient of S_{n+1} [BH, E, M]; None while it is zero (no dS_final: the last chunk's),
    # as the forward's S: a zero [BH, E, M] buffer and its products cost more than a short
    # sequence's whole backward on a CPU
    Gn = dS_final
    grads_after, dus, drs = [], [], []  # per chunk, collected last to first
    for n in range(N - 1, -1, -1):
        grads_after.append(Gn)
        # the output's gradient or the state's, at least one of which reaches the last chunk
        du = out_du[:, n] if Gn is None else (
            torch.bmm(K_write[:, n], Gn) if out_du is None else torch.baddbmm(out_du[:, n], K_write[:, n], Gn))
        dr = torch.bmm(Tb[:, n].transpose(1, 2), du)
        dus.append(du)
        drs.append(dr)
        if n == 0 and not has_S0:
            break  # the gradient of a zero initial state is not needed
        carried = None if Gn is None else Gn if gates is None else Gn * gates.chunk[:, n]
        if reads is not None:
            carried = reads[:, n] if carried is None else carried + reads[:, n]
        read_t = K_read[:, n].transpose(1, 2)  # [BH, E, C]
        Gn = torch.bmm(read_t, dr).neg_() if carried is None else torch.baddbmm(carried, read_t, dr, alpha=-1)
    du, dr = (stack_chunks(x[::-1]) for x in (dus, drs))  # [BH, N, C, M]
    return du, dr, stack_chunk_states(grads_after[::-1], K), Gn if has_S0 else None


def _read_gradients(Q, K, u, states, gates, dO_, dr, grad_after):
    """The gradients through the reads and the state updates, per chunk ([BHN, C, E] each, None while zero):
    (dQ, dK, dK_read, dQ_read, dP). Ungated, dK and dQ are whole; gated, the parts the decays scale (dK_read,
    dQ_read, and dP = tril(dO Uᵀ)) go to gated_backward_terms."""
    BH, N, C, E = K.shape
    BHN, M = BH * N, u.shape[-1]
    K_, u_, dr_ = K.view(BHN, C, E), u.view(BHN, C, M), dr.view(BHN, C, M)
    states_t = None if states is None else states.view(BHN, E, M).transpose(1, 2)  # [BHN, M, E]
    # from S_{n+1} = S_n + Kᵀ u
    dK = None if grad_after is None else torch.bmm(u_, grad_after.view(BHN, E, M).transpose(1, 2))
    dK_read = dQ_read = dP = dQ = None
    if states is not None:  # from r = V − K S_n
        if gates is None:
            dK = _add_bmm(dK, dr_, states_t, alpha=-1)
        else:
            dK_read = torch.bmm(dr_, states_t).neg_()
    if dO_ is not None:
        dP = torch.bmm(dO_, u_.transpose(1, 2)).tril_()  # [BHN, C, C]
        if gates is None:
            dQ = torch.bmm(dP, K_)
            dK = _add_bmm(dK, dP.transpose(1, 2), Q.view(BHN, C, E))
            if states is not None:
                dQ.baddbmm_(dO_, states_t)
        elif states is not None:
            dQ_read = torch.bmm(dO_, states_t)
    return dQ, dK, dK_read, dQ_read, dP


def _solve_gradients(X, T, beta, r, du):
    """The gradients through U = T_beta R, T = (I + diag(beta) X)^-1: (dbeta [BHN, C], dX [BHN, C, C])."""
    BHN, C, _ = T.shape
    M = r.shape[-1]
    b = beta.view(BHN, C, 1)
    # the [BHN, C, C] temporaries below reuse two buffers: fresh ones cost as much as the matmuls on a CPU
    dTb = torch.bmm(du.view(BHN, C, M), r.view(BHN, C, M).transpose(1, 2))  # [BHN, C, C]
    product = dTb * T
    dbeta = product.sum(1)  # [BHN, C], column sums of dT_β ⊙ T
    dT = dTb.mul_(b.transpose(1, 2))
    Tt = T.transpose(1, 2)
    dL = torch.bmm(torch.bmm(Tt, dT), Tt, out=dT).neg_().tril_(-1)  # [BHN, C, C], over dT
    dbeta += torch.mul(dL, X, out=product).sum(2)  # row sums of dL ⊙ X
    return dbeta, dL.mul_(b)
