"""The delta rule's fused read in Triton, backward (the forward's maths: fused_kernels.py). With dO the upstream
gradient and U = diag(beta) R:

    dU = P^T dO (non-causal gated: diag(w) (Q^ K^^T)^T dO)          delta_backward_du, grid (B H, key blocks)
    (I + diag(beta) X)^T G = dU                                     delta_backward_solve, grid B H, last block first
    dv = diag(beta) G,  dbeta = rowsum(G * R),  dX = -diag(beta) G U^T (strictly lower)
    dg_t = -beta_t G_t . v_t + (causal: dO_t . O_t; non-causal: sum_i dO_i . O_i at t = T - 1 only)
    dK^ = dS^T Q^ + (dX~ + dX~^T) K^,  dQ^ = dS K^                   delta_backward_k, delta_backward_q

with dS = dO U'^T masked (U' = U, times w non-causal gated; causal gated decayed by exp(g_t - g_s) as P) and
dX~ = dX decayed as X. dg: a pair decay passes dM_ts M_ts to +g_t and -g_s (fw_fairseq/ops/README.md §8), and those
sums are M wide: for P, dO_t . O_t and U_s . dU_s; for X, -beta_t G_t . (X U)_t = -beta_t G_t . (v_t - R_t) and
U_s . (G_s - dU_s) (as X^T diag(beta) G = dU - G); w passes U_s . dU_s to g_T - g_s; the terms in R and dU cancel.
autograd takes dg back to alpha (fused_read.py).

dk and dq never form dK^ whole: a chunk of its feature columns is a sum of score-shaped coefficient tiles (M-wide
products) times a chunk of phi^. The normalisation's backward (normalize_function.py) needs y . dK^ per row
(y = phi^), which the same sums give M wide, with no pass over E: q^_i . dQ^_i = sum_j dS_ij P_ij = dO_i . O_i, and
k^_j . dK^_j = U_j . dU_j + (rowsum + colsum)_j(dX * X) = beta_j G_j . (2 R_j - v_j). Then per chunk
dphi = dK^ / n - a z, a = (y . dK^) / n where the norm is unclamped, z = 1 (sum) or y (l2), and phi's backward
(phi_tiles.dx_chunk).
"""
import triton
import triton.language as tl

from fw_fairseq.ops.fused_read.phi_tiles import (FAVOR, SIZES, block_rows, dx_chunk, favor_shift_dx, load_tile,
                                                  phi_chunk, row_stats, store_tile)
from fw_fairseq.ops.rules.delta.fused_kernels import (delta_program, gate, key_pairs, read_mask, read_scores,
                                                      unit_lower_inverse, writes)


@triton.jit(do_not_specialize=SIZES)
def delta_backward_du(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, proj_ptr, H, Tq, T, d, E, m, M,
                      eps, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, do_ptr, sgb, sgh, sgt, w_ptr,
                      CAUSAL: tl.constexpr, GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr,
                      DB: tl.constexpr, MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
                      ACC: tl.constexpr):
    """dU [BT, M] of one key block, into the scratch w [B, H, T, M]."""
    bh, b, h, kj, q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr = delta_program(
        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, H, Tq, T, M, sqb, sqh, skb, skh, svb, svh, BT)
    do_ptr += b * sgb + h * sgh
    krows, kok = block_rows(kj, T, BT)
    ks = row_stats(k_ptr, proj_ptr, krows, kok, skt, d, E, m, False, MAP, DB, EC, PREC)
    du = tl.zeros([BT, MB], dtype=ACC)
    for qi in range(kj if CAUSAL else 0, Tq, BT):
        qrows, qok = block_rows(qi, Tq, BT)
        qs = row_stats(q_ptr, proj_ptr, qrows, qok, sqt, d, E, m, True, MAP, DB, EC, PREC)
        p, _ = read_scores(q_ptr, k_ptr, g_ptr, proj_ptr, qrows, qok, krows, kok, sqt, skt, qs, ks, d, E, m, eps,
                           CAUSAL, GATED, L2, MAP, DB, EC, PREC, ACC)
        du += tl.dot(tl.trans(p), load_tile(do_ptr, qrows, qok, sgt, M, MB).to(ACC), input_precision=PREC)
    if GATED and not CAUSAL:
        g = tl.load(g_ptr + krows, mask=kok, other=0.0).to(ACC)
        du = du * tl.exp(tl.load(g_ptr + T - 1).to(ACC) - g)[:, None]
    store_tile(w_ptr + bh * T * M, krows, kok, M, M, du, MB)


@triton.jit
def _read_total(o_ptr, do_ptr, Tq, M, sot, sgt, BT: tl.constexpr, MB: tl.constexpr, ACC: tl.constexpr):
    """sum_i dO_i . O_i over every query of one head."""
    total = tl.zeros([BT], dtype=ACC)
    for qi in range(0, Tq, BT):
        qrows, qok = block_rows(qi, Tq, BT)
        total += tl.sum(load_tile(o_ptr, qrows, qok, sot, M, MB).to(ACC)
                        * load_tile(do_ptr, qrows, qok, sgt, M, MB).to(ACC), axis=1)
    return tl.sum(total, axis=0)


@triton.jit(do_not_specialize=SIZES)
def delta_backward_solve(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, proj_ptr, H, Tq, T, d, E, m,
                         M, eps, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, do_ptr, sgb, sgh, sgt, w_ptr,
                         o_ptr, sob, soh, sot, dv_ptr, sdb, sdh, sdt, dbeta_ptr, dg_ptr,
                         CAUSAL: tl.constexpr, GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr,
                         DB: tl.constexpr, MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
                         ACC: tl.constexpr):
    """G [T, M] of one head in place of dU in w, last block first; dv, dbeta and (gated) dg."""
    bh, b, h, start, q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr = delta_program(
        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, H, Tq, T, M, sqb, sqh, skb, skh, svb, svh, BT)
    o_ptr += b * sob + h * soh
    do_ptr += b * sgb + h * sgh
    w_ptr += bh * T * M  # the scratch [B, H, T, M], laid out as R
    total = 0.0
    if GATED and not CAUSAL:
        total = _read_total(o_ptr, do_ptr, Tq, M, sot, sgt, BT, MB, ACC)
    blocks = tl.cdiv(T, BT)
    for i in range(0, blocks):
        c0 = (blocks - 1 - i) * BT
        rows, ok = block_rows(c0, T, BT)
        st = row_stats(k_ptr, proj_ptr, rows, ok, skt, d, E, m, False, MAP, DB, EC, PREC)
        rhs = load_tile(w_ptr, rows, ok, M, M, MB).to(ACC)
        for p0 in range(c0 + BT, T, BT):
            prows, pok = block_rows(p0, T, BT)
            pst = row_stats(k_ptr, proj_ptr, prows, pok, skt, d, E, m, False, MAP, DB, EC, PREC)
            x, _ = key_pairs(k_ptr, g_ptr, proj_ptr, prows, pok, rows, ok, skt, pst, st, d, E, m, eps, GATED, L2,
                             MAP, DB, EC, PREC, ACC)  # X[later rows, these rows]
            bg = load_tile(w_ptr, prows, pok, M, M, MB).to(ACC)
            bg = bg * tl.load(beta_ptr + prows, mask=pok, other=0.0).to(ACC)[:, None]
            rhs -= tl.dot(tl.trans(x), bg, input_precision=PREC)
        x, _ = key_pairs(k_ptr, g_ptr, proj_ptr, rows, ok, rows, ok, skt, st, st, d, E, m, eps, GATED, L2,
                         MAP, DB, EC, PREC, ACC)
        beta = tl.load(beta_ptr + rows, mask=ok, other=0.0).to(ACC)
        # (I + diag(beta) X_cc)^T G_c = rhs
        grad = tl.dot(tl.trans(unit_lower_inverse(x * beta[:, None], BT)), rhs, input_precision=PREC)
        store_tile(w_ptr, rows, ok, M, M, grad, MB)
        tl.debug_barrier()  # the earlier blocks load these rows of G
        r = load_tile(r_ptr, rows, ok, M, M, MB).to(ACC)
        tl.store(dbeta_ptr + bh * T + rows, tl.sum(grad * r, axis=1), mask=ok)
        store_tile(dv_ptr + b * sdb + h * sdh, rows, ok, sdt, M, grad * beta[:, None], MB)
        if GATED:
            v = load_tile(v_ptr, rows, ok, svt, M, MB).to(ACC)
            dg = -beta * tl.sum(grad * v, axis=1)
            if CAUSAL:
                dg += tl.sum(load_tile(o_ptr, rows, ok, sot, M, MB).to(ACC)
                             * load_tile(do_ptr, rows, ok, sgt, M, MB).to(ACC), axis=1)
            else:
                dg += tl.where(rows == T - 1, total, 0.0)
            tl.store(dg_ptr + bh * T + rows, dg, mask=ok)


@triton.jit
def _phi_grad(gh, own, n, a, L2: tl.constexpr):
    """A chunk's dphi [BT, EC] from dphi^ = gh: gh / n - a z, own the chunk of phi (z = phi / n for l2, 1 for sum:
    dx_chunk drops the columns past E)."""
    z = 1.0
    if L2:
        z = own / n[:, None]
    return gh / n[:, None] - a[:, None] * z


@triton.jit
def _key_coefficients(r_ptr, beta_ptr, g_ptr, w_ptr, krows, kok, srows, sok, bgk, uk, gk, T, M,
                      GATED: tl.constexpr, MB: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """(dX~ + dX~^T)[krows, srows]: -beta_t G_t . U_s for s < t, decayed as X, and its transpose (bgk = beta_k G_k)."""
    bgs = load_tile(w_ptr, srows, sok, M, M, MB).to(ACC)
    bgs = bgs * tl.load(beta_ptr + srows, mask=sok, other=0.0).to(ACC)[:, None]
    us = writes(r_ptr, beta_ptr, g_ptr, srows, sok, T, M, False, MB, ACC)
    lower = -tl.dot(bgk, tl.trans(us), input_precision=PREC)
    upper = -tl.dot(uk, tl.trans(bgs), input_precision=PREC)
    both = kok[:, None] & sok[None, :]
    diff = lower
    if GATED:
        diff = gk[:, None] - tl.load(g_ptr + srows, mask=sok, other=0.0).to(ACC)[None, :]
    return (gate(lower, both & (srows[None, :] < krows[:, None]), diff, GATED)
            + gate(upper, both & (srows[None, :] > krows[:, None]), -diff, GATED))


@triton.jit
def _key_chunk(q_ptr, k_ptr, g_ptr, r_ptr, beta_ptr, w_ptr, proj_ptr, do_ptr, nq_ptr, nk_ptr, cols, kj, krows, kok,
               bgk, uk, uk_read, gk, Tq, T, d, E, m, M, eps, sqt, skt, sgt,
               CAUSAL: tl.constexpr, GATED: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr, MB: tl.constexpr,
               EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """A chunk of dK^ [BT, EC] of one key block: dS^T Q^ + (dX~ + dX~^T) K^ (nq_ptr, nk_ptr at this head)."""
    dkh = tl.zeros([BT, EC], dtype=ACC)
    for qi in range(kj if CAUSAL else 0, Tq, BT):
        qrows, qok = block_rows(qi, Tq, BT)
        qs = row_stats(q_ptr, proj_ptr, qrows, qok, sqt, d, E, m, True, MAP, DB, EC, PREC)
        ds = tl.dot(load_tile(do_ptr, qrows, qok, sgt, M, MB).to(ACC), tl.trans(uk_read), input_precision=PREC)
        ds = read_mask(ds, qrows, qok, krows, kok, g_ptr, CAUSAL, GATED)
        nq = tl.maximum(tl.load(nq_ptr + qrows, mask=qok, other=0.0), eps)
        pq = phi_chunk(q_ptr, proj_ptr, qrows, qok, sqt, cols, d, E, m, qs[0], qs[1], qs[2], qs[3], True, MAP,
                       DB, PREC).to(ACC) / nq[:, None]
        dkh += tl.dot(tl.trans(ds), pq, input_precision=PREC)
    for s0 in range(0, T, BT):
        srows, sok = block_rows(s0, T, BT)
        sst = row_stats(k_ptr, proj_ptr, srows, sok, skt, d, E, m, False, MAP, DB, EC, PREC)
        coef = _key_coefficients(r_ptr, beta_ptr, g_ptr, w_ptr, krows, kok, srows, sok, bgk, uk, gk, T, M, GATED, MB,
                                 PREC, ACC)
        ns = tl.maximum(tl.load(nk_ptr + srows, mask=sok, other=0.0), eps)
        ps = phi_chunk(k_ptr, proj_ptr, srows, sok, skt, cols, d, E, m, sst[0], sst[1], sst[2], sst[3], False,
                       MAP, DB, PREC).to(ACC) / ns[:, None]
        dkh += tl.dot(coef, ps, input_precision=PREC)
    return dkh


@triton.jit(do_not_specialize=SIZES)
def delta_backward_k(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, proj_ptr, H, Tq, T, d, E, m, M,
                     eps, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, do_ptr, sgb, sgh, sgt, w_ptr,
                     dk_ptr, sdb, sdh, sdt,
                     CAUSAL: tl.constexpr, GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr,
                     DB: tl.constexpr, MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
                     ACC: tl.constexpr):
    """dk [BT, d] of one key block (w holds G)."""
    bh, b, h, kj, q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr = delta_program(
        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, H, Tq, T, M, sqb, sqh, skb, skh, svb, svh, BT)
    w_ptr += bh * T * M  # the scratch [B, H, T, M], laid out as R
    krows, kok = block_rows(kj, T, BT)
    ks = row_stats(k_ptr, proj_ptr, krows, kok, skt, d, E, m, False, MAP, DB, EC, PREC)
    raw = tl.load(nk_ptr + krows, mask=kok, other=0.0)
    n = tl.maximum(raw, eps)
    beta = tl.load(beta_ptr + krows, mask=kok, other=0.0).to(ACC)
    bgk = load_tile(w_ptr, krows, kok, M, M, MB).to(ACC) * beta[:, None]
    r = load_tile(r_ptr, krows, kok, M, M, MB).to(ACC)
    # k^_j . dK^_j = beta_j G_j . (2 R_j - v_j) (module docstring)
    yg = tl.sum(bgk * (2.0 * r - load_tile(v_ptr, krows, kok, svt, M, MB).to(ACC)), axis=1)
    a = tl.where(raw > eps, yg / n, 0.0)
    uk = r * beta[:, None]
    uk_read = writes(r_ptr, beta_ptr, g_ptr, krows, kok, T, M, GATED and not CAUSAL, MB, ACC)
    gk = tl.load(g_ptr + krows, mask=kok, other=0.0).to(ACC)
    dx = tl.zeros([BT, DB], dtype=ACC)
    for c0 in range(0, E, EC):
        cols = c0 + tl.arange(0, EC)
        dkh = _key_chunk(q_ptr, k_ptr, g_ptr, r_ptr, beta_ptr, w_ptr, proj_ptr, do_ptr + b * sgb + h * sgh, nq_ptr,
                         nk_ptr, cols, kj, krows, kok, bgk, uk, uk_read, gk, Tq, T, d, E, m, M, eps, sqt, skt, sgt,
                         CAUSAL, GATED, MAP, DB, MB, EC, BT, PREC, ACC)
        own = phi_chunk(k_ptr, proj_ptr, krows, kok, skt, cols, d, E, m, ks[0], ks[1], ks[2], ks[3], False, MAP,
                        DB, PREC).to(ACC)
        dx += dx_chunk(k_ptr, proj_ptr, krows, kok, skt, cols, _phi_grad(dkh, own, n, a, L2), d, E, m, ks[0], ks[1],
                       ks[2], ks[3], False, MAP, DB, PREC).to(ACC)
    store_tile(dk_ptr + b * sdb + h * sdh, krows, kok, sdt, d, dx, DB)


@triton.jit(do_not_specialize=SIZES)
def delta_backward_q(q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, proj_ptr, H, Tq, T, d, E, m, M,
                     eps, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, do_ptr, sgb, sgh, sgt, o_ptr, sob, soh, sot,
                     dq_ptr, sdb, sdh, sdt,
                     CAUSAL: tl.constexpr, GATED: tl.constexpr, L2: tl.constexpr, MAP: tl.constexpr,
                     DB: tl.constexpr, MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
                     ACC: tl.constexpr):
    """dq [BT, d] of one query block."""
    bh, b, h, qi, q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr = delta_program(
        q_ptr, k_ptr, v_ptr, beta_ptr, g_ptr, r_ptr, nq_ptr, nk_ptr, H, Tq, T, M, sqb, sqh, skb, skh, svb, svh, BT)
    qrows, qok = block_rows(qi, Tq, BT)
    qs = row_stats(q_ptr, proj_ptr, qrows, qok, sqt, d, E, m, True, MAP, DB, EC, PREC)
    raw = tl.load(nq_ptr + qrows, mask=qok, other=0.0)
    n = tl.maximum(raw, eps)
    do = load_tile(do_ptr + b * sgb + h * sgh, qrows, qok, sgt, M, MB).to(ACC)
    # q^_i . dQ^_i = dO_i . O_i (module docstring)
    yg = tl.sum(do * load_tile(o_ptr + b * sob + h * soh, qrows, qok, sot, M, MB).to(ACC), axis=1)
    a = tl.where(raw > eps, yg / n, 0.0)
    dx = tl.zeros([BT, DB], dtype=ACC)
    de = tl.zeros([BT], dtype=ACC)  # FAVOR+: sum(dphi * phi), for the shift's gradient
    hi = tl.minimum(T, qi + BT) if CAUSAL else T
    for c0 in range(0, E, EC):
        cols = c0 + tl.arange(0, EC)
        dqh = tl.zeros([BT, EC], dtype=ACC)  # this chunk of dQ^
        for kj in range(0, hi, BT):
            krows, kok = block_rows(kj, T, BT)
            ks = row_stats(k_ptr, proj_ptr, krows, kok, skt, d, E, m, False, MAP, DB, EC, PREC)
            u = writes(r_ptr, beta_ptr, g_ptr, krows, kok, T, M, GATED and not CAUSAL, MB, ACC)
            ds = read_mask(tl.dot(do, tl.trans(u), input_precision=PREC), qrows, qok, krows, kok, g_ptr, CAUSAL,
                           GATED)
            nk = tl.maximum(tl.load(nk_ptr + krows, mask=kok, other=0.0), eps)
            pk = phi_chunk(k_ptr, proj_ptr, krows, kok, skt, cols, d, E, m, ks[0], ks[1], ks[2], ks[3], False, MAP,
                           DB, PREC).to(ACC) / nk[:, None]
            dqh += tl.dot(ds, pk, input_precision=PREC)
        own = phi_chunk(q_ptr, proj_ptr, qrows, qok, sqt, cols, d, E, m, qs[0], qs[1], qs[2], qs[3], True, MAP,
                        DB, PREC).to(ACC)
        dphi = _phi_grad(dqh, own, n, a, L2)
        dx += dx_chunk(q_ptr, proj_ptr, qrows, qok, sqt, cols, dphi, d, E, m, qs[0], qs[1], qs[2], qs[3], True,
                       MAP, DB, PREC).to(ACC)
        if MAP == FAVOR:
            de += tl.sum(dphi * own, axis=1)
    if MAP == FAVOR:
        dx += favor_shift_dx(q_ptr, proj_ptr, qrows, qok, sqt, d, m, qs[1], de, DB).to(ACC)
    store_tile(dq_ptr + b * sdb + h * sdh, qrows, qok, sdt, d, dx, DB)
