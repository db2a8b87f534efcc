"""The delta rule's fused read in Triton, forward: phi of the raw heads formed per tile (phi_tiles.py) and normalised
per row (--fw-delta-norm: phi / max(norm(phi), PHI_EPS), norm the sum or the l2 norm), every product of features a
score tile on chip, never [B, H, T, E] in memory.

With K^, Q^ the normalised features, X = tril(K^ K^^T, -1) and, gated (g_t = sum_{s<=t} log alpha_s),
X and the causal P decayed pairwise by exp(g_t - g_s) (fw_fairseq/ops/README.md §8):

    (I + diag(beta) X) U = diag(beta) V              (rules/delta/writes.py: the writes u_s)
    causal:      O = (tril(Q^ K^^T) [* decay]) U
    non-causal:  O = (Q^ K^^T) diag(w) U,  w_s = exp(g_T - g_s) (W's decay of write s; 1 ungated)

The kernels keep R = V - X U instead of U: U = diag(beta) R, and R_c of a block c of BT positions is
R_c = (I + X_cc diag(beta_c))^-1 (V_c - sum_{c'<c} X_cc' U_c'), X_cc strictly lower (unit_lower_inverse).
R is what the backward needs besides U (dbeta = rowsum(G * R)). A score tile scales phi(a) phi(b)^T by both rows'
1 / max(norm, PHI_EPS), the norms summed over the chunks of the same pass.

delta_writes (grid B H, blocks in order: each needs the writes before it) writes R [B, H, T, M] and the keys'
unclamped norms; delta_output (grid B H, query blocks) reads them into O and writes the queries' norms.
Every kernel takes the same leading arguments (fused_read._common) and starts from them the same way
(delta_program), each using those it needs.
"""
import triton
import triton.language as tl

from fw_fairseq.ops.fused_read.phi_tiles import (SIZES, block_rows, head_program, load_tile, phi_chunk, row_stats,
                                                  store_tile)


@triton.jit
def gate(x, keep, diff, GATED: tl.constexpr):
    """x where keep, else 0; gated, times exp(diff) (diff <= 0 where keep)."""
    if GATED:
        x = x * tl.exp(tl.where(keep, diff, 0.0))
    return tl.where(keep, x, 0.0)


@triton.jit
def gram(a_ptr, b_ptr, proj_ptr, arows, aok, brows, bok, sa, sb, sta, stb, d, E, m, eps,
         A_QUERY: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr, EC: tl.constexpr,
         PREC: tl.constexpr, ACC: tl.constexpr):
    """phi^(a) phi^(b)^T [BA, BB] (b keys; a queries where A_QUERY) and the unclamped norms of a's and b's rows."""
    s = tl.zeros([arows.shape[0], brows.shape[0]], dtype=ACC)
    na = tl.zeros([arows.shape[0]], dtype=ACC)
    nb = tl.zeros([brows.shape[0]], dtype=ACC)
    for c0 in range(0, E, EC):
        cols = c0 + tl.arange(0, EC)
        pa = phi_chunk(a_ptr, proj_ptr, arows, aok, sa, cols, d, E, m, sta[0], sta[1], sta[2], sta[3], A_QUERY, MAP,
                       DB, PREC).to(ACC)
        pb = phi_chunk(b_ptr, proj_ptr, brows, bok, sb, cols, d, E, m, stb[0], stb[1], stb[2], stb[3], False, MAP,
                       DB, PREC).to(ACC)
        s += tl.dot(pa, tl.trans(pb), input_precision=PREC)
        if L2:
            na += tl.sum(pa * pa, axis=1)
            nb += tl.sum(pb * pb, axis=1)
        else:
            na += tl.sum(pa, axis=1)
            nb += tl.sum(pb, axis=1)
    if L2:
        na = tl.sqrt(na)
        nb = tl.sqrt(nb)
    s = s / (tl.maximum(na, eps)[:, None] * tl.maximum(nb, eps)[None, :])
    return s, na, nb


@triton.jit
def key_pairs(k_ptr, g_ptr, proj_ptr, arows, aok, brows, bok, skt, sta, stb, d, E, m, eps,
              GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr, EC: tl.constexpr,
              PREC: tl.constexpr, ACC: tl.constexpr):
    """X[arows, brows]: k^_t . k^_s for s < t (gated: times exp(g_t - g_s)), and a's unclamped norms."""
    x, na, _ = gram(k_ptr, k_ptr, proj_ptr, arows, aok, brows, bok, skt, skt, sta, stb, d, E, m, eps, False, L2,
                    MAP, DB, EC, PREC, ACC)
    keep = aok[:, None] & bok[None, :] & (brows[None, :] < arows[:, None])
    diff = x
    if GATED:
        diff = (tl.load(g_ptr + arows, mask=aok, other=0.0)[:, None]
                - tl.load(g_ptr + brows, mask=bok, other=0.0)[None, :]).to(ACC)
    return gate(x, keep, diff, GATED), na


@triton.jit
def read_scores(q_ptr, k_ptr, g_ptr, proj_ptr, qrows, qok, krows, kok, sqt, skt, qs, ks, d, E, m, eps,
                CAUSAL: tl.constexpr, GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr,
                EC: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """P[qrows, krows] = q^_t . k^_s (causal: s <= t, gated times exp(g_t - g_s)) and the queries' unclamped norms."""
    p, nq, _ = gram(q_ptr, k_ptr, proj_ptr, qrows, qok, krows, kok, sqt, skt, qs, ks, d, E, m, eps, True, L2,
                    MAP, DB, EC, PREC, ACC)
    return read_mask(p, qrows, qok, krows, kok, g_ptr, CAUSAL, GATED), nq


@triton.jit
def read_mask(p, qrows, qok, krows, kok, g_ptr, CAUSAL: tl.constexpr, GATED: tl.constexpr):
    """A read's tile [BQ, BK] masked (causal: key s <= query t) and, causal and gated, decayed by exp(g_t - g_s)."""
    keep = qok[:, None] & kok[None, :]
    diff = p
    if CAUSAL:
        keep = keep & (krows[None, :] <= qrows[:, None])
        if GATED:
            diff = (tl.load(g_ptr + qrows, mask=qok, other=0.0)[:, None]
                    - tl.load(g_ptr + krows, mask=kok, other=0.0)[None, :]).to(p.dtype)
    return gate(p, keep, diff, GATED and CAUSAL)


@triton.jit
def writes(r_ptr, beta_ptr, g_ptr, rows, ok, T, M, DECAYED: tl.constexpr, MB: tl.constexpr, ACC: tl.constexpr):
    """U [BT, MB] = diag(beta) R of rows; DECAYED (a gated non-causal read): times w_s = exp(g_T - g_s)."""
    beta = tl.load(beta_ptr + rows, mask=ok, other=0.0).to(ACC)
    u = load_tile(r_ptr, rows, ok, M, M, MB).to(ACC) * beta[:, None]
    if DECAYED:
        g = tl.load(g_ptr + rows, mask=ok, other=0.0).to(ACC)
        u = u * tl.exp(tl.load(g_ptr + T - 1).to(ACC) - g)[:, None]
    return u


@triton.jit
def unit_lower_inverse(n, BT: tl.constexpr):
    """(I + n)^-1 [BT, BT] of n strictly lower triangular, by doubling its inverted diagonal blocks: with the blocks
    of size s inverted, each block of size 2s [[A, 0], [C, D]] has the inverse [[A^-1, 0], [-D^-1 C A^-1, D^-1]],
    for all of them at once: inv - inv (n restricted to the C blocks) inv. log2(BT) steps of two products, each
    block's inverse formed from its own entries only: not the product of the (I + n^(2^j)), whose powers of n can
    grow far beyond the inverse's entries and cancel."""
    idx = tl.arange(0, BT)
    inv = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0).to(n.dtype)
    s = 1
    while s < BT:
        # the lower left blocks of the 2s blocks: same 2s block, rows in its second half, columns in its first
        pair = (idx[:, None] // (2 * s)) == (idx[None, :] // (2 * s))
        c = tl.where(pair & ((idx[:, None] // s) > (idx[None, :] // s)), n, 0.0)
        inv -= tl.dot(tl.dot(inv, c, input_precision="ieee"), inv, input_precision="ieee")
        s *= 2
    return inv


@triton.jit
def delta_program(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, H, Tq, T, M, sqb, sqh, skb, skh, svb,
                  svh, BT: tl.constexpr):
    """Every delta kernel's prologue: head_program's (b H + h, b, h, first row of the block, q, k, v at this head),
    then the pointers to this head of beta, g, nk [B, H, T], R [B, H, T, M] and nq [B, H, Tq], all contiguous. On
    the grids of one program per head (delta_writes, delta_backward_solve) the first row is 0, unused."""
    bh, b, h, start, q_ptr, k_ptr, v_ptr = head_program(q_ptr, k_ptr, v_ptr, H, sqb, sqh, skb, skh, svb, svh, BT)
    return (bh, b, h, start, q_ptr, k_ptr, v_ptr, beta_ptr + bh * T, g_ptr + bh * T, r_ptr + bh * T * M,
            nq_ptr + bh * Tq, nk_ptr + bh * T)


@triton.jit(do_not_specialize=SIZES)
def delta_writes(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, proj_ptr, H, Tq, T, d, E, m, M, eps,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt,
                 CAUSAL: tl.constexpr, GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr,
                 MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """R [T, M] of one head, block after block (module docstring), and the keys' unclamped norms."""
    bh, b, h, start, q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr = delta_program(
        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, H, Tq, T, M, sqb, sqh, skb, skh, svb, svh, BT)
    for c0 in range(0, T, BT):
        rows, ok = block_rows(c0, T, BT)
        st = row_stats(k_ptr, proj_ptr, rows, ok, skt, d, E, m, False, MAP, DB, EC, PREC)
        rhs = load_tile(v_ptr, rows, ok, svt, M, MB).to(ACC)
        for p0 in range(0, c0, BT):
            prows, pok = block_rows(p0, T, BT)
            pst = row_stats(k_ptr, proj_ptr, prows, pok, skt, d, E, m, False, MAP, DB, EC, PREC)
            x, _ = key_pairs(k_ptr, g_ptr, proj_ptr, rows, ok, prows, pok, skt, st, pst, d, E, m, eps, GATED, L2,
                             MAP, DB, EC, PREC, ACC)
            u = writes(r_ptr, beta_ptr, g_ptr, prows, pok, T, M, False, MB, ACC)
            rhs -= tl.dot(x, u, input_precision=PREC)
        x, nk = key_pairs(k_ptr, g_ptr, proj_ptr, rows, ok, rows, ok, skt, st, st, d, E, m, eps, GATED, L2,
                          MAP, DB, EC, PREC, ACC)
        beta = tl.load(beta_ptr + rows, mask=ok, other=0.0).to(ACC)
        r = tl.dot(unit_lower_inverse(x * beta[None, :], BT), rhs, input_precision=PREC)
        store_tile(r_ptr, rows, ok, M, M, r, MB)
        tl.store(nk_ptr + rows, nk, mask=ok)
        tl.debug_barrier()  # the next blocks load these rows of R


@triton.jit(do_not_specialize=SIZES)
def delta_output(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, proj_ptr, H, Tq, T, d, E, m, M, eps,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, o_ptr, sob, soh, sot,
                 CAUSAL: tl.constexpr, GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr,
                 MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """O [BT, M] of one query block of one head, and the queries' unclamped norms."""
    bh, b, h, qi, q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr = delta_program(
        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, H, Tq, T, M, sqb, sqh, skb, skh, svb, svh, BT)
    qrows, qok = block_rows(qi, Tq, BT)
    qs = row_stats(q_ptr, proj_ptr, qrows, qok, sqt, d, E, m, True, MAP, DB, EC, PREC)
    acc = tl.zeros([BT, MB], dtype=ACC)
    nq = tl.zeros([BT], dtype=ACC)
    hi = tl.minimum(T, qi + BT) if CAUSAL else T
    for kj in range(0, hi, BT):
        krows, kok = block_rows(kj, T, BT)
        ks = row_stats(k_ptr, proj_ptr, krows, kok, skt, d, E, m, False, MAP, DB, EC, PREC)
        p, nq = read_scores(q_ptr, k_ptr, g_ptr, proj_ptr, qrows, qok, krows, kok, sqt, skt, qs, ks, d, E, m, eps,
                            CAUSAL, GATED, L2, MAP, DB, EC, PREC, ACC)
        u = writes(r_ptr, beta_ptr, g_ptr, krows, kok, T, M, GATED and not CAUSAL, MB, ACC)
        acc += tl.dot(p, u, input_precision=PREC)
    store_tile(o_ptr + b * sob + h * soh, qrows, qok, sot, M, acc, MB)
    tl.store(nq_ptr + qrows, nq, mask=qok)
