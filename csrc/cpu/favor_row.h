// FAVOR+'s row form for the CPU kernels (map_rows.h's interface: prepare, phi, backward, and the two hooks begin and
// end that its projections need); attend_heads.h's with_row picks it by the map's code.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "map_rows.h"

namespace fw {

// FAVOR+ with R [m, d] (a buffer, no gradient), E = 2m: x' = x d^-1/4, u = R x', h = |x'|^2 / 2, e = [u - h, -u - h],
// phi = exp(e - c) / sqrt(2m) with c = max_j e_j = max_j |u_j| - h for a query (a factor its read divides out) and 0
// for a key. As exp(u_j) K and exp(-u_j) K, K = exp(-h - c) / sqrt(2m) (a query's exp(-max |u_j|), exactly: h
// cancels): both halves from one range reduction (vexp.h's exp_pair_lanes), where max |u_j| and h + c are at most
// kPairMax; past it each half is exp of its own e (exp(u_j) or K alone would leave the normal range).
// Backward (favor_function.py): de = g phi; for a query de[argmax] -= sum(de) (the shift's gradient; then sum(de) = 0
// and |x'|^2's term drops); du = de[:m] - de[m:]; dx = (du R - x' sum(de) (keys)) d^-1/4.
// The projections of a block of rows are matrix products (begin: U = X R^T; end: DX += dU R d^-1/4), through BLAS
// where `blas`: a row at a time they cost 4 times DPFP-2's whole read (u and dx are m and d wide, the registers hold
// neither, each of their d or m updates a load and a store of all of it). A row's phi is kept from its first
// prepare until the next begin: the backward prepares each row again.
template <typename T>
struct FavorRow : RowDefaults {
  static constexpr int64_t kTransposedRows = 8;  // fewer rows (a decoding step's) take R as it is, not a copy
  int64_t d, m;
  const T* R;  // [m, d]
  bool blas;
  T scale, inv;  // d^-1/4, 1 / sqrt(2m)
  const T *X = nullptr, *x = nullptr;  // the block's rows (begin); the row last prepared
  int64_t queries = 0, n = 0;  // the block's query rows (its first); the index of the row last prepared
  std::vector<T> RT, U, dU, dUR, Phi, wide;  // R^T [d, m]; X R^T, dU [rows, m]; dU R [rows, d]; phi [rows, 2m]; e [2m]
  std::vector<int64_t> top;  // [rows]: a query's argmax of e (the first, where tied); -1: the row is not formed yet
  FavorRow(const T* R_, int64_t d_, int64_t m_, bool blas_)
      : d(d_), m(m_), R(R_), blas(blas_), scale(T(std::pow(double(d_), -0.25))),
        inv(T(1.0 / std::sqrt(double(2 * m_)))), wide(2 * m_) {}
  int64_t width() const { return 2 * m; }
  FW_INLINE void begin(const T* rows, int64_t count, int64_t query_rows) {
    X = rows;
    queries = query_rows;
    for (auto* buffer : {&U, &dU}) buffer->resize(count * m);
    dUR.resize(count * d);
    Phi.resize(count * 2 * m);
    top.assign(count, -1);
    if (count < kTransposedRows) return mm_abt(count, m, d, rows, R, U.data(), blas);
    if (RT.empty()) {  // X R^T as X (R^T): BLAS took half as long again with R transposed in the call (24 rows)
      RT.resize(d * m);
      for (int64_t j = 0; j < m; ++j)
        for (int64_t i = 0; i < d; ++i) RT[i * m + j] = R[j * d + i];
    }
    mm_ab(count, m, d, rows, RT.data(), U.data(), blas);
  }
  FW_INLINE void prepare(const T* __restrict__ row) {
    x = row;
    n = (row - X) / d;
    if (top[n] >= 0) return;
    const T* __restrict__ xr = U.data() + n * m;  // u = xr d^-1/4: the scale keeps the order of the entries
    const T h = T(0.5) * lane_sum<T>(d, [&](int64_t i) { return (row[i] * scale) * (row[i] * scale); });
    T lo, hi;
    min_max(xr, m, lo, hi);
    const T u_max = hi * scale, u_min = lo * scale, s = std::max(u_max, -u_min);  // s = max_j |u_j|
    const bool query = n < queries;
    const T c = query ? s - h : T(0), shift = query ? s : h;  // e - c = [u - shift, -u - shift]
    top[n] = 0;
    if (query)  // e's first maximum: in u - h at u's maximum, else in -u - h at u's minimum
      top[n] = u_max >= -u_min ? std::find(xr, xr + m, hi) - xr : m + (std::find(xr, xr + m, lo) - xr);
    T* __restrict__ p = Phi.data() + n * 2 * m;
    if (std::max(s, shift) <= ExpConstants<T>::kPairMax) {  // exp(+-u_j) and K normal
      const T K = exp_lanes<T>(typename Lanes<T>::Vec{} - shift)[0] * inv;
      exp_pair_row(xr, scale, T(0), K, p, p + m, m);
    } else {
      T* __restrict__ e = wide.data();
      for (int64_t j = 0; j < m; ++j) {
        e[j] = xr[j] * scale - h;
        e[m + j] = -xr[j] * scale - h;
      }
      exp_row(e, T(1), -c, p, 2 * m);
      for (int64_t j = 0; j < 2 * m; ++j) p[j] *= inv;
    }
  }
  FW_INLINE void phi(T* out) const { std::copy(Phi.data() + n * 2 * m, Phi.data() + (n + 1) * 2 * m, out); }
  FW_INLINE void backward(const T* __restrict__ g, T* __restrict__ dx) {
    T* __restrict__ du = dU.data() + n * m;
    const T* __restrict__ p = Phi.data() + n * 2 * m;
    const T total = lane_sum<T>(m, [&](int64_t j) {  // sum(de), du in the same pass
      const T a = g[j] * p[j], b = g[m + j] * p[m + j];
      du[j] = (a - b) * scale;
      return a + b;
    });
    const bool query = n < queries;
    if (query) {  // de[top] -= sum(de): in du with the sign of top's half
      const int64_t t = top[n];
      if (t < m) du[t] -= total * scale;
      else du[t - m] += total * scale;
    }
    const T h_grad = query ? T(0) : -total * scale;
    for (int64_t i = 0; i < d; ++i) dx[i] = h_grad * (x[i] * scale);
  }
  FW_INLINE void end(T* DX, int64_t count) {
    mm_ab(count, d, m, dU.data(), R, dUR.data(), blas);
    for (int64_t i = 0; i < count * d; ++i) DX[i] += dUR[i];
  }
};

}  // namespace fw
