"""The sum rule's fused read, forward and backward, in Triton: phi formed per tile from the raw heads (phi_tiles.py),
the scores P = mask(phi(q) phi(k)^T) and their row sums (the z column) on chip, never [B, H, T, E] in memory.

    y = A v,  A = P / n,  n = rowsum(P) + Z_EPS  (= W^T phi(q) / (z . phi(q) + Z_EPS) of the sum rule)
    backward, with delta = rowsum(dy * y):  dv = A^T dy,  dP = (dy v^T - delta) / n,
        dphi(q) = dP phi(k),  dphi(k) = dP^T phi(q),  then phi's backward per chunk (phi_tiles.dx_chunk).

The forward saves y and n only; the backward recomputes P from the raw heads. Grids: (B H, query blocks) for the
forward and dq, (B H, key blocks) for dk and dv. A padded key (mask != 0) has phi(k) = 0: it reads nothing and its
dk is 0, as the CPU kernel's. Causal blocks need Tq = T and mask key s > query t.

ALIGN = P > 0 weighs the scores by the aligned cross-attention's w = cos^(2P)((a_i - b_j) / 2) of the queries' and
keys' angles (qa [B, Tq], kb [B, T]; fw_fairseq/modules/cross_align.py): P = W * mask(phi(q) phi(k)^T), so dP and the
scores of dv carry the same constant W. It is formed on chip from the angles, never as [Tq, T] in memory.
"""
import triton
import triton.language as tl

from fw_fairseq.ops.fused_read.phi_tiles import (FAVOR, SIZES, block_rows, dx_chunk, favor_shift_dx, head_program,
                                                  load_tile, phi_chunk, row_stats, store_tile)


@triton.jit
def _key_rows(mask_ptr, b, start, T, BT: tl.constexpr, HAS_MASK: tl.constexpr):
    """The rows start.. of a key block and which of them exist and are not padding."""
    rows, ok = block_rows(start, T, BT)
    if HAS_MASK:
        ok = ok & (tl.load(mask_ptr + b * T + rows, mask=ok, other=1) == 0)
    return rows, ok


@triton.jit
def _scores(q_ptr, k_ptr, proj_ptr, qrows, qok, krows, kok, sq, sk, qs, ks, d, E, m,
            MAP: tl.constexpr, DB: tl.constexpr, EC: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """phi(q) phi(k)^T [BQ, BK] over all E columns, chunk by chunk (qs, ks: the rows' row_stats)."""
    s = tl.zeros([qrows.shape[0], krows.shape[0]], dtype=ACC)
    for c0 in range(0, E, EC):
        cols = c0 + tl.arange(0, EC)
        pq = phi_chunk(q_ptr, proj_ptr, qrows, qok, sq, cols, d, E, m, qs[0], qs[1], qs[2], qs[3], True, MAP, DB, PREC)
        pk = phi_chunk(k_ptr, proj_ptr, krows, kok, sk, cols, d, E, m, ks[0], ks[1], ks[2], ks[3], False, MAP, DB,
                       PREC)
        s += tl.dot(pq.to(ACC), tl.trans(pk.to(ACC)), input_precision=PREC)
    return s


@triton.jit
def _keep(qrows, krows, kok, CAUSAL: tl.constexpr):
    keep = kok[None, :]
    if CAUSAL:
        keep = keep & (krows[None, :] <= qrows[:, None])
    return keep


@triton.jit
def _weigh(s, qa_ptr, kb_ptr, b, Tq, T, qrows, qok, krows, kok, ALIGN: tl.constexpr):
    """s [BQ, BK] times the aligned weight cos^(2 ALIGN)((a_i - b_j) / 2) of its rows' angles; ALIGN 0: s."""
    if ALIGN:
        a = tl.load(qa_ptr + b * Tq + qrows, mask=qok, other=0.0)
        c = tl.cos((a[:, None] - tl.load(kb_ptr + b * T + krows, mask=kok, other=0.0)[None, :]) * 0.5)
        c2 = c * c
        w = c2
        for _ in tl.static_range(ALIGN - 1):
            w = w * c2
        s = s * w.to(s.dtype)
    return s


@triton.jit
def _query_grads(o_ptr, do_ptr, n_ptr, bh, b, h, qrows, qok, Tq, M, sob, soh, sot, sgb, sgh, sgt,
                 MB: tl.constexpr, ACC: tl.constexpr):
    """A query block's dy [BT, M], delta = rowsum(dy * y) and n [BT]."""
    dy = load_tile(do_ptr + b * sgb + h * sgh, qrows, qok, sgt, M, MB).to(ACC)
    delta = tl.sum(dy * load_tile(o_ptr + b * sob + h * soh, qrows, qok, sot, M, MB).to(ACC), axis=1)
    return dy, delta, tl.load(n_ptr + bh * Tq + qrows, mask=qok, other=1.0)


@triton.jit(do_not_specialize=SIZES)
def sum_forward(q_ptr, k_ptr, v_ptr, o_ptr, n_ptr, mask_ptr, proj_ptr, qa_ptr, kb_ptr, H, Tq, T, d, E, m, M, eps,
                sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot,
                CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ALIGN: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr,
                MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr, ACC: tl.constexpr):
    """y [BT, M] of one query block of one head, and its n [BT]."""
    bh, b, h, qi, q_ptr, k_ptr, v_ptr = head_program(q_ptr, k_ptr, v_ptr, H, sqb, sqh, skb, skh, svb, svh, BT)
    qrows, qok = block_rows(qi, Tq, BT)
    qs = row_stats(q_ptr, proj_ptr, qrows, qok, sqt, d, E, m, True, MAP, DB, EC, PREC)
    acc = tl.zeros([BT, MB], dtype=ACC)
    z = tl.zeros([BT], dtype=ACC)
    hi = tl.minimum(T, qi + BT) if CAUSAL else T
    for kj in range(0, hi, BT):
        krows, kok = _key_rows(mask_ptr, b, kj, T, BT, HAS_MASK)
        ks = row_stats(k_ptr, proj_ptr, krows, kok, skt, d, E, m, False, MAP, DB, EC, PREC)
        s = _scores(q_ptr, k_ptr, proj_ptr, qrows, qok, krows, kok, sqt, skt, qs, ks, d, E, m, MAP, DB, EC, PREC, ACC)
        s = _weigh(tl.where(_keep(qrows, krows, kok, CAUSAL), s, 0.0), qa_ptr, kb_ptr, b, Tq, T, qrows, qok, krows,
                   kok, ALIGN)
        z += tl.sum(s, axis=1)
        acc += tl.dot(s, load_tile(v_ptr, krows, kok, svt, M, MB).to(ACC), input_precision=PREC)
    n = z + eps
    store_tile(o_ptr + b * sob + h * soh, qrows, qok, sot, M, acc / n[:, None], MB)
    tl.store(n_ptr + bh * Tq + qrows, n, mask=qok)


@triton.jit(do_not_specialize=SIZES)
def sum_backward_q(q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, n_ptr, dq_ptr, mask_ptr, proj_ptr, qa_ptr, kb_ptr,
                   H, Tq, T, d, E, m, M, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, sgb, sgh, sgt,
                   CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ALIGN: tl.constexpr, MAP: tl.constexpr,
                   DB: tl.constexpr, MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
                   ACC: tl.constexpr):
    """dq [BT, d] of one query block (dq has q's strides; dy = do has o's)."""
    bh, b, h, qi, q_ptr, k_ptr, v_ptr = head_program(q_ptr, k_ptr, v_ptr, H, sqb, sqh, skb, skh, svb, svh, BT)
    qrows, qok = block_rows(qi, Tq, BT)
    qs = row_stats(q_ptr, proj_ptr, qrows, qok, sqt, d, E, m, True, MAP, DB, EC, PREC)
    dy, delta, n = _query_grads(o_ptr, do_ptr, n_ptr, bh, b, h, qrows, qok, Tq, M, sob, soh, sot, sgb, sgh, sgt,
                                MB, ACC)
    dx = tl.zeros([BT, DB], dtype=ACC)
    de_sum = tl.zeros([BT], dtype=ACC)  # FAVOR+: sum(dphi(q) * phi(q)), for the shift's gradient
    hi = tl.minimum(T, qi + BT) if CAUSAL else T
    for kj in range(0, hi, BT):
        krows, kok = _key_rows(mask_ptr, b, kj, T, BT, HAS_MASK)
        ks = row_stats(k_ptr, proj_ptr, krows, kok, skt, d, E, m, False, MAP, DB, EC, PREC)
        v = load_tile(v_ptr, krows, kok, svt, M, MB).to(ACC)
        dp = (tl.dot(dy, tl.trans(v), input_precision=PREC) - delta[:, None]) / n[:, None]
        dp = _weigh(tl.where(_keep(qrows, krows, kok, CAUSAL), dp, 0.0), qa_ptr, kb_ptr, b, Tq, T, qrows, qok, krows,
                    kok, ALIGN)  # [BT, BT]
        for c0 in range(0, E, EC):
            cols = c0 + tl.arange(0, EC)
            pk = phi_chunk(k_ptr, proj_ptr, krows, kok, skt, cols, d, E, m, ks[0], ks[1], ks[2], ks[3], False, MAP,
                           DB, PREC).to(ACC)
            g = tl.dot(dp, pk, input_precision=PREC)  # dphi(q) [BT, EC]
            dx += dx_chunk(q_ptr, proj_ptr, qrows, qok, sqt, cols, g, d, E, m, qs[0], qs[1], qs[2], qs[3], True,
                           MAP, DB, PREC).to(ACC)
            if MAP == FAVOR:
                pq = phi_chunk(q_ptr, proj_ptr, qrows, qok, sqt, cols, d, E, m, qs[0], qs[1], qs[2], qs[3], True,
                               MAP, DB, PREC)
                de_sum += tl.sum(g * pq.to(ACC), axis=1)
    if MAP == FAVOR:
        dx += favor_shift_dx(q_ptr, proj_ptr, qrows, qok, sqt, d, m, qs[1], de_sum, DB).to(ACC)
    store_tile(dq_ptr + b * sqb + h * sqh, qrows, qok, sqt, d, dx, DB)


@triton.jit(do_not_specialize=SIZES)
def sum_backward_kv(q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, n_ptr, dk_ptr, dv_ptr, mask_ptr, proj_ptr, qa_ptr, kb_ptr,
                    H, Tq, T, d, E, m, M, sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sob, soh, sot, sgb, sgh, sgt,
                    CAUSAL: tl.constexpr, HAS_MASK: tl.constexpr, ALIGN: tl.constexpr, MAP: tl.constexpr,
                    DB: tl.constexpr, MB: tl.constexpr, EC: tl.constexpr, BT: tl.constexpr, PREC: tl.constexpr,
                    ACC: tl.constexpr):
    """dk [BT, d] and dv [BT, M] of one key block (dk has k's strides, dv v's)."""
    bh, b, h, kj, q_ptr, k_ptr, v_ptr = head_program(q_ptr, k_ptr, v_ptr, H, sqb, sqh, skb, skh, svb, svh, BT)
    krows, kok = _key_rows(mask_ptr, b, kj, T, BT, HAS_MASK)
    ks = row_stats(k_ptr, proj_ptr, krows, kok, skt, d, E, m, False, MAP, DB, EC, PREC)
    v = load_tile(v_ptr, krows, kok, svt, M, MB).to(ACC)
    dv = tl.zeros([BT, MB], dtype=ACC)
    dx = tl.zeros([BT, DB], dtype=ACC)
    for qi in range(kj if CAUSAL else 0, Tq, BT):
        qrows, qok = block_rows(qi, Tq, BT)
        qs = row_stats(q_ptr, proj_ptr, qrows, qok, sqt, d, E, m, True, MAP, DB, EC, PREC)
        keep = _keep(qrows, krows, kok, CAUSAL)
        s = _scores(q_ptr, k_ptr, proj_ptr, qrows, qok, krows, kok, sqt, skt, qs, ks, d, E, m, MAP, DB, EC, PREC, ACC)
        dy, delta, n = _query_grads(o_ptr, do_ptr, n_ptr, bh, b, h, qrows, qok, Tq, M, sob, soh, sot, sgb, sgh,
                                    sgt, MB, ACC)
        s = _weigh(tl.where(keep, s, 0.0), qa_ptr, kb_ptr, b, Tq, T, qrows, qok, krows, kok, ALIGN)
        dv += tl.dot(tl.trans(s / n[:, None]), dy, input_precision=PREC)
        dp = (tl.dot(dy, tl.trans(v), input_precision=PREC) - delta[:, None]) / n[:, None]
        dpt = tl.trans(_weigh(tl.where(keep, dp, 0.0), qa_ptr, kb_ptr, b, Tq, T, qrows, qok, krows, kok,
                              ALIGN))  # [BT keys, BT queries]
        for c0 in range(0, E, EC):
            cols = c0 + tl.arange(0, EC)
            pq = phi_chunk(q_ptr, proj_ptr, qrows, qok, sqt, cols, d, E, m, qs[0], qs[1], qs[2], qs[3], True, MAP,
                           DB, PREC).to(ACC)
            g = tl.dot(dpt, pq, input_precision=PREC)  # dphi(k) [BT, EC]
            dx += dx_chunk(k_ptr, proj_ptr, krows, kok, skt, cols, g, d, E, m, ks[0], ks[1], ks[2], ks[3], False,
                           MAP, DB, PREC).to(ACC)
    store_tile(dk_ptr + b * skb + h * skh, krows, krows < T, skt, d, dx, DB)
    store_tile(dv_ptr + b * svb + h * svh, krows, krows < T, svt, M, dv, MB)
