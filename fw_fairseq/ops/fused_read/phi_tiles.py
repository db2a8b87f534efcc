"""phi of a tile of raw rows, formed in registers, for the fused reads' Triton kernels (rules/sum/fused_kernels.py,
rules/delta/fused_kernels.py): the same functions as feature_maps.py's maps, one chunk of feature columns at a time,
so that no [B, H, T, E] tensor is ever written.

A map is a code (MAP, cpu_extension.KERNEL_MAPS' numbering) and its numbers: d (the head's width), nu (DPFP's),
m (FAVOR+'s random features; R at proj_ptr, [m, d] row-major, float32). A tile is the rows `rows` [BT] of one head
(row stride `srow`, entries contiguous); `ok` [BT] marks the rows that exist. A chunk is the feature columns
`cols` [EC]; columns at or past E read as 0. Beside phi, the tiles every kernel loads and stores (load_tile,
store_tile) and the head and block of its program (head_program).

- `row_stats`: what a row's features depend on beyond its own entries: FAVOR+ a query's shift (the maximum of e,
  and its column), Hedgehog the two softmaxes' maxima and sums.
- `phi_chunk`: phi[rows, cols], fp32 (fp64 for fp64 heads).
- `dx_chunk`: the heads' gradient [BT, DB] from dphi[rows, cols] (the chunk's part of it; chunks add up).
  FAVOR+ queries add `favor_shift_dx` once after their last chunk: the gradient of the shift, which the CPU form
  (favor_function.py) puts on each row's maximum.

A column's source entries, per map:
- DPFP-nu (E = 2 d nu): column f = s 2d + i is r_i r_j, j = (i - s - 1) mod 2d, r = [relu(x), relu(-x)]: two gathered
  loads of the raw row (they hit the L1 cache), and its backward two one-hot products (scatter_cols).
- ELU+1 (E = d): x_f.  Hedgehog (E = 2d, one chunk holds a whole row): +x_f, then -x_(f - d).
- FAVOR+ (E = 2m): e_f = +-(x' R^T)_(f mod m) - |x'|^2 / 2, x' = x d^-1/4, phi = exp(e - c) / sqrt(2m).
"""
import triton
import triton.language as tl

from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS

# the maps' codes, as the kernels take them (MAP): constexpr, the only globals a compiled kernel may read
DPFP, ELU, HEDGEHOG, FAVOR = (tl.constexpr(KERNEL_MAPS[name]) for name in ("dpfp", "elu", "hedgehog", "favor"))
# the sizes phi's forms convert to floats (d^-1/4, sqrt(2m)): a kernel that passes them on names them in its
# do_not_specialize, as Triton would make a size of 1 a constant, which has no .to()
SIZES = ("d", "m")


@triton.jit
def load_rows(x_ptr, rows, ok, srow, DB: tl.constexpr, d):
    """The raw rows [BT, DB] (0 past d and at rows that do not exist), in their own dtype."""
    c = tl.arange(0, DB)
    return tl.load(x_ptr + rows[:, None] * srow + c[None, :], mask=ok[:, None] & (c[None, :] < d), other=0.0)


@triton.jit
def block_rows(start, n, BT: tl.constexpr):
    """The rows start.. of a block [BT] and which of them exist."""
    rows = start + tl.arange(0, BT)
    return rows, rows < n


@triton.jit
def load_tile(ptr, rows, ok, stride, n, NB: tl.constexpr):
    """ptr[rows, :n] [BT, NB], 0 elsewhere."""
    c = tl.arange(0, NB)
    return tl.load(ptr + rows[:, None] * stride + c[None, :], mask=ok[:, None] & (c[None, :] < n), other=0.0)


@triton.jit
def store_tile(ptr, rows, ok, stride, n, x, NB: tl.constexpr):
    """ptr[rows, :n] = x [BT, NB], in ptr's dtype."""
    c = tl.arange(0, NB)
    tl.store(ptr + rows[:, None] * stride + c[None, :], x.to(ptr.dtype.element_ty), mask=ok[:, None] & (c[None, :] < n))


@triton.jit
def head_program(q_ptr, k_ptr, v_ptr, H, sqb, sqh, skb, skh, svb, svh, BT: tl.constexpr):
    """The program of a grid (B H, blocks of BT positions): its (b H + h, b, h, first row of its block) and the
    pointers to its head of q, k and v (each [B, H, rows, ...] with batch and head strides s?b, s?h)."""
    bh, start = tl.program_id(0), tl.program_id(1) * BT
    b, h = bh // H, bh % H
    return bh, b, h, start, q_ptr + b * sqb + h * sqh, k_ptr + b * skb + h * skh, v_ptr + b * svb + h * svh


@triton.jit
def _gather(x_ptr, rows, ok, srow, src, live):
    """x[rows, src] [BT, EC] in fp32 or fp64 (zero where not `live`)."""
    x = tl.load(x_ptr + rows[:, None] * srow + src[None, :], mask=ok[:, None] & live[None, :], other=0.0)
    return x.to(tl.float64) if x.dtype == tl.float64 else x.to(tl.float32)


@triton.jit
def _dpfp_sources(cols, d):
    """DPFP's column f = s 2d + i -> (entry and sign of r_i, entry and sign of r_j), j = (i - s - 1) mod 2d."""
    two_d = 2 * d
    s = cols // two_d
    i = cols % two_d
    j = (i - s - 1 + two_d) % two_d
    return i % d, i < d, j % d, j < d


@triton.jit
def _quarter_root(d, dtype: tl.constexpr):
    """d^-1/4 in dtype (FAVOR+'s x' = x d^-1/4)."""
    return tl.exp(tl.log(d.to(dtype)) * -0.25)


@triton.jit
def _favor_e(x_ptr, proj_ptr, rows, ok, srow, cols, live, d, m, DB: tl.constexpr, PREC: tl.constexpr):
    """FAVOR+'s e [BT, EC] of the chunk and x' [BT, DB]."""
    xs = load_rows(x_ptr, rows, ok, srow, DB, d)
    xs = xs.to(tl.float64) if xs.dtype == tl.float64 else xs.to(tl.float32)
    xs = xs * _quarter_root(d, xs.dtype)
    c = tl.arange(0, DB)
    r = tl.load(proj_ptr + (cols % m)[None, :] * d + c[:, None], mask=live[None, :] & (c[:, None] < d), other=0.0)
    sign = tl.where(cols < m, 1.0, -1.0)
    r = (r * sign[None, :]).to(xs.dtype)  # [DB, EC]: the signed rows of R, one per column
    half_sq = 0.5 * tl.sum(xs * xs, axis=1)
    e = tl.dot(xs, r, input_precision=PREC) - half_sq[:, None]
    return e, xs


@triton.jit
def row_stats(x_ptr, proj_ptr, rows, ok, srow, d, E, m, IS_QUERY: tl.constexpr, MAP: tl.constexpr,
              DB: tl.constexpr, EC: tl.constexpr, PREC: tl.constexpr):
    """(a, b, c, e) [BT] each: FAVOR+ query (max e, its column, 0, 0); Hedgehog (max x, sum exp(x - max x),
    max -x, sum exp(-x - max -x)); zeros otherwise."""
    x = load_rows(x_ptr, rows, ok, srow, DB, d)
    x = x.to(tl.float64) if x.dtype == tl.float64 else x.to(tl.float32)
    zero = tl.sum(x, axis=1) * 0.0
    a, b, c, e = zero, zero, zero, zero
    if MAP == HEDGEHOG:
        live = tl.arange(0, DB)[None, :] < d
        a = tl.max(tl.where(live, x, -float("inf")), axis=1)
        b = tl.sum(tl.where(live, tl.exp(x - a[:, None]), 0.0), axis=1)
        c = tl.max(tl.where(live, -x, -float("inf")), axis=1)
        e = tl.sum(tl.where(live, tl.exp(-x - c[:, None]), 0.0), axis=1)
    if MAP == FAVOR and IS_QUERY:
        a = zero - float("inf")
        for c0 in range(0, E, EC):
            cols = c0 + tl.arange(0, EC)
            live = cols < E
            ec, _ = _favor_e(x_ptr, proj_ptr, rows, ok, srow, cols, live, d, m, DB, PREC)
            ec = tl.where(live[None, :], ec, -float("inf"))
            cmax = tl.max(ec, axis=1)
            carg = tl.argmax(ec, axis=1) + c0
            b = tl.where(cmax > a, carg.to(b.dtype), b)
            a = tl.maximum(a, cmax)
    return a, b, c, e


@triton.jit
def phi_chunk(x_ptr, proj_ptr, rows, ok, srow, cols, d, E, m, st_a, st_b, st_c, st_d,
              IS_QUERY: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr, PREC: tl.constexpr):
    """phi[rows, cols] [BT, EC], unnormalised, 0 at columns >= E and at rows that do not exist."""
    live = cols < E
    if MAP == DPFP:
        ia, pa, ib, pb = _dpfp_sources(cols, d)
        xa = _gather(x_ptr, rows, ok, srow, ia, live)
        xb = _gather(x_ptr, rows, ok, srow, ib, live)
        phi = tl.maximum(tl.where(pa[None, :], xa, -xa), 0.0) * tl.maximum(tl.where(pb[None, :], xb, -xb), 0.0)
    elif MAP == ELU:
        x = _gather(x_ptr, rows, ok, srow, cols, live)
        phi = tl.where(x > 0, x + 1.0, tl.exp(x))
    elif MAP == HEDGEHOG:
        pos = cols < d
        x = _gather(x_ptr, rows, ok, srow, cols % d, live)
        y = tl.where(pos[None, :], x, -x)
        shift = tl.where(pos[None, :], st_a[:, None], st_c[:, None])
        total = tl.where(pos[None, :], st_b[:, None], st_d[:, None])
        phi = tl.exp(y - shift) / total
    else:
        e, _ = _favor_e(x_ptr, proj_ptr, rows, ok, srow, cols, live, d, m, DB, PREC)
        if IS_QUERY:
            e = e - st_a[:, None]
        phi = tl.exp(e) / tl.sqrt((2 * m).to(e.dtype))
    return tl.where(live[None, :] & ok[:, None], phi, 0.0)


@triton.jit
def scatter_cols(g, src, DB: tl.constexpr, PREC: tl.constexpr):
    """dx [BT, DB] with dx[:, c] = sum of g's columns whose source entry is c: g [BT, EC] @ onehot [EC, DB]."""
    onehot = (src[:, None] == tl.arange(0, DB)[None, :]).to(g.dtype)
    return tl.dot(g, onehot, input_precision=PREC)


@triton.jit
def dx_chunk(x_ptr, proj_ptr, rows, ok, srow, cols, dphi, d, E, m, st_a, st_b, st_c, st_d,
             IS_QUERY: tl.constexpr, MAP: tl.constexpr, DB: tl.constexpr, PREC: tl.constexpr):
    """The chunk's part of dx [BT, DB] from dphi [BT, EC] (phi unnormalised)."""
    live = cols < E
    dphi = tl.where(live[None, :] & ok[:, None], dphi, 0.0)
    if MAP == DPFP:
        ia, pa, ib, pb = _dpfp_sources(cols, d)
        xa = _gather(x_ptr, rows, ok, srow, ia, live)
        xb = _gather(x_ptr, rows, ok, srow, ib, live)
        ra = tl.maximum(tl.where(pa[None, :], xa, -xa), 0.0)
        rb = tl.maximum(tl.where(pb[None, :], xb, -xb), 0.0)
        # d r / d x = +-1 where r > 0 (relu's gradient at 0 is 0, as torch's)
        ga = tl.where(ra > 0, tl.where(pa[None, :], dphi * rb, -dphi * rb), 0.0)
        gb = tl.where(rb > 0, tl.where(pb[None, :], dphi * ra, -dphi * ra), 0.0)
        dx = scatter_cols(ga, ia, DB, PREC) + scatter_cols(gb, ib, DB, PREC)
    elif MAP == ELU:
        x = _gather(x_ptr, rows, ok, srow, cols, live)
        dx = scatter_cols(dphi * tl.where(x > 0, 1.0, tl.exp(x)), cols, DB, PREC)
    elif MAP == HEDGEHOG:
        phi = phi_chunk(x_ptr, proj_ptr, rows, ok, srow, cols, d, E, m, st_a, st_b, st_c, st_d,
                        IS_QUERY, MAP, DB, PREC)
        pos = cols < d
        pd = phi * dphi
        dot_pos = tl.sum(tl.where(pos[None, :], pd, 0.0), axis=1)
        dot_neg = tl.sum(tl.where(pos[None, :], 0.0, pd), axis=1)
        dy = pd - phi * tl.where(pos[None, :], dot_pos[:, None], dot_neg[:, None])  # softmax's backward, per half
        dx = scatter_cols(tl.where(pos[None, :], dy, -dy), cols % d, DB, PREC)
    else:
        phi = phi_chunk(x_ptr, proj_ptr, rows, ok, srow, cols, d, E, m, st_a, st_b, st_c, st_d,
                        IS_QUERY, MAP, DB, PREC)
        de = dphi * phi
        _, xs = _favor_e(x_ptr, proj_ptr, rows, ok, srow, cols, live, d, m, DB, PREC)
        c = tl.arange(0, DB)
        r = tl.load(proj_ptr + (cols % m)[:, None] * d + c[None, :], mask=live[:, None] & (c[None, :] < d), other=0.0)
        r = (r * tl.where(cols < m, 1.0, -1.0)[:, None]).to(de.dtype)  # [EC, DB]
        # e = x' R^T - |x'|^2 / 2: dx' = de R - sum(de) x'; then x' = x d^-1/4
        dx = (tl.dot(de, r, input_precision=PREC) - tl.sum(de, axis=1)[:, None] * xs) * _quarter_root(d, xs.dtype)
    return dx


@triton.jit
def favor_shift_dx(x_ptr, proj_ptr, rows, ok, srow, d, m, arg, de_sum, DB: tl.constexpr):
    """A FAVOR+ query's shift c = e[arg]: its gradient -sum(de) de[arg]/dx, added once per row after the chunks
    (de_sum [BT] = sum over all columns of dphi * phi)."""
    c = tl.arange(0, DB)
    live = ok[:, None] & (c[None, :] < d)
    col = arg.to(tl.int32)
    r = tl.load(proj_ptr + (col % m)[:, None] * d + c[None, :], mask=live, other=0.0)
    r = r * tl.where(col < m, 1.0, -1.0)[:, None]
    x = load_rows(x_ptr, rows, ok, srow, DB, d)
    x = x.to(tl.float64) if x.dtype == tl.float64 else x.to(tl.float32)
    scale = _quarter_root(d, x.dtype)
    xs = x * scale
    # de[arg]/dx' = +-R_arg - x'
    return -de_sum[:, None] * (r.to(xs.dtype) - xs) * scale
