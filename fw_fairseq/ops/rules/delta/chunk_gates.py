"""The gated delta rule's decays inside a chunk, from its cumulative log-gates (README §8).

g [BH, N, C] holds, per chunk, g_t = Σ_{s≤t} log α_s over the chunk's positions up to t (the padded
tail has α = 1: log-gate 0). Every decay the chunk form needs is exp of a difference of g's that
is ≤ 0, so nothing overflows however small the gates are (a product of α's may underflow to 0, which
is its correct limit); no 1/γ_s is ever formed.
"""
import torch


class ChunkGates:
    """The decays of one set of chunks, derived from g [BH, N, C]:

    pair   [BHN, C, C]  exp(g_t − g_s) for s ≤ t, 0 above: how much of position s's write is left at t
    read   [BH, N, C, 1] exp(g_t): how much of the state before the chunk is left at t
    write  [BH, N, C, 1] exp(g_C − g_t): how much of position t's write is left at the chunk's end
    chunk  [BH, N, 1, 1] exp(g_C): the decay of the state over the whole chunk
    """

    def __init__(self, g):
        BH, N, C = g.shape
        diff = g.view(BH * N, C, 1) - g.view(BH * N, 1, C)  # [BHN, C, C], g_t − g_s
        above = torch.ones(C, C, dtype=torch.bool, device=g.device).triu_(1)  # s > t: masked before exp
        self.pair = diff.masked_fill_(above, float("-inf")).exp_()
        self.read = g.exp().unsqueeze(-1)
        last = g[..., -1:]  # [BH, N, 1]
        self.write = (last - g).exp_().unsqueeze(-1)
        self.chunk = last.exp().unsqueeze(-1)


def gated_backward_terms(gates, K_, Q_, dK_write, dK_read, dQ_read, dP, P, dX, X):
    """Gradients of the chunk form's gated terms, as (dK, dQ, dg), from the gradients of the terms the
    ungated form has (all [BHN, ...] views):

    dK_write [C, E]  of the decayed write keys  write·K   (S_{n+1} = chunk·S_n + (write·K)ᵀ u)
    dK_read  [C, E]  of the decayed read keys   read·K    (r = V − (read·K) S_n), or None (zero state)
    dQ_read  [C, E]  of the decayed queries     read·Q    (O = P u + (read·Q) S_n), or None
    dP       [C, C]  of P = tril(Q Kᵀ) ⊙ pair, or None (no output); overwritten
    dX       [C, C]  of X = tril(K Kᵀ, −1) ⊙ pair; overwritten
    P, X: the gated matrices of the forward. dg [BHN, C] is the gradient of g, without the chunk
    decay's term (which needs the states; the caller adds it to dg[:, -1]).
    A pair decay p_ts = exp(g_t − g_s) passes d(log p_ts) = dM_ts M_ts (M its gated matrix) to +g_t
    and −g_s; a row scale exp(h_t) passes rowsum(d(h·A) ⊙ h·A) to h_t.
    """
    BHN, C, _ = X.shape
    read, write = (x.view(BHN, C, 1) for x in (gates.read, gates.write))
    dK = dK_write.mul_(write)  # [BHN, C, E]
    w = (dK * K_).sum(2)  # [BHN, C], to +g_C and −g_t
    dg = -w
    dg[:, -1] += w.sum(1)
    if dK_read is not None:
        dK_read.mul_(read)
        dg += (dK_read * K_).sum(2)
        dK += dK_read
    dlog_pair = dX * X  # [BHN, C, C]
    dQ = None
    if dP is not None:
        dlog_pair += dP * P
        dP.mul_(gates.pair)  # the gradient of tril(Q Kᵀ)
        dQ = torch.bmm(dP, K_)
        dK.baddbmm_(dP.transpose(1, 2), Q_)
        if dQ_read is not None:
            dQ_read.mul_(read)
            dg += (dQ_read * Q_).sum(2)
            dQ += dQ_read
    dX.mul_(gates.pair)  # the gradient of tril(K Kᵀ, −1)
    dK.baddbmm_(dX + dX.transpose(1, 2), K_)
    dg += dlog_pair.sum(2) - dlog_pair.sum(1)
    return dK, dQ, dg
