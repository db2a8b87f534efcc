// The feature maps a row at a time, as the CPU kernels take them (dpfp.cpp, feature_attend.cpp), and the row loops
// with phi's normalisation (normalize_function.py) that run any of them.
//
// A row map is a struct with scratch for one row: prepare(x) reads a raw row x [d] once, phi(out) writes its features
// [width()] unnormalised, backward(g, dx) writes dx [d] from g = dphi [width()] of the row last prepared. It is made
// once per parallel task (its buffers), and its member functions are always_inline: they must be compiled inside
// each FW_CLONES clone (kernels.h) that calls them. Two hooks for FAVOR+, no-ops for the others (RowDefaults):
// begin(X, rows, queries) comes before any row of the block X [rows, d] is prepared (its first `queries` rows are
// queries', the others keys'), and end(DX, rows) after the backward has written all of DX [rows, d], so that a
// product of the rows with a matrix runs as one matrix product and a row can be told a query's or a key's
// (attend_heads.h's HeadBuffers calls them once per head, for the rows of its queries and keys; the row loops below
// do not). Each map is the same function as its
// PyTorch form in fw_fairseq/ops/feature_maps.py; the kernels' codes for them are cpu_extension.KERNEL_MAPS's.
// FAVOR+'s row, the one with hooks, is favor_row.h's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dot.h"
#include "dpfp_rows.h"
#include "products.h"
#include "vexp.h"

#define FW_INLINE inline __attribute__((always_inline))

namespace fw {

enum Map : int64_t { kDpfp = 0, kElu = 1, kHedgehog = 2, kFavor = 3 };

// the hooks of a map whose rows are the same function for queries and keys, each row on its own
struct RowDefaults {
  template <typename T>
  FW_INLINE void begin(const T*, int64_t, int64_t) {}
  template <typename T>
  FW_INLINE void end(T*, int64_t) {}
};

// DPFP-nu, E = 2 d nu: phi_i[j] = r[j] r[(j - i) mod w], r = [relu(x), relu(-x)], w = 2d (dpfp_rows.h);
// dx[k] = dr[k] where x[k] > 0, -dr[k + d] where x[k] < 0, else 0 (relu's gradient at 0, as autograd's)
template <typename T>
struct DpfpRow : RowDefaults {
  int64_t d, nu;
  std::vector<T> r_ext, dr;  // [r[w - nu:], r, r[:nu]]: r[j -/+ i] at r_ext + nu + j -/+ i (dr_terms); dr [w]
  DpfpRow(int64_t d_, int64_t nu_) : d(d_), nu(nu_), r_ext(2 * d_ + 2 * nu_), dr(2 * d_) {}
  int64_t width() const { return 2 * d * nu; }
  FW_INLINE void prepare(const T* x) {
    rolled_row(x, r_ext.data(), d, nu);  // [r[w - nu:], r]
    std::copy(r_ext.data() + nu, r_ext.data() + 2 * nu, r_ext.data() + nu + 2 * d);  // and r[:nu] after it
  }
  FW_INLINE void phi(T* out) const { phi_row(r_ext.data() + nu, out, 2 * d, nu); }
  FW_INLINE void backward(const T* g, T* dx) {
    dr_terms(g, r_ext.data(), dr.data(), 2 * d, nu);
    const T* r = r_ext.data() + nu;
    for (int64_t k = 0; k < d; ++k) dx[k] = r[k] > T(0) ? dr[k] : (r[k + d] > T(0) ? -dr[k + d] : T(0));
  }
};

// out[k] = x[k] > 0 ? a[k] : b[k], k < n, a vector of lanes at a time: written as a loop of scalar selects, GCC keeps
// a branch per entry (not vectorised, and mispredicted on half of them: ELU+1's row took 5 times as long)
template <typename T>
FW_INLINE void select_positive(const T* __restrict__ x, const T* __restrict__ a, const T* __restrict__ b,
                               T* __restrict__ out, int64_t n) {
  using Vec = typename Lanes<T>::Vec;
  constexpr int64_t L = Lanes<T>::kWidth;
  const Vec zero = {};
  int64_t k = 0;
  for (; k + L <= n; k += L) {
    const Vec y = load(x + k) > zero ? load(a + k) : load(b + k);
    std::memcpy(out + k, &y, sizeof y);
  }
  for (; k < n; ++k) out[k] = x[k] > T(0) ? a[k] : b[k];
}

// (min, max) of x [n], n >= 1, a vector of lanes at a time: a scalar running max waits on each compare (no
// -ffast-math lets GCC reorder it), which took half of Hedgehog's row
template <typename T>
FW_INLINE void min_max(const T* __restrict__ x, int64_t n, T& lo, T& hi) {
  using Vec = typename Lanes<T>::Vec;
  constexpr int64_t L = Lanes<T>::kWidth;
  lo = hi = x[0];
  int64_t k = 0;
  if (n >= L) {
    Vec vlo = load(x), vhi = vlo;
    for (k = L; k + L <= n; k += L) {
      const Vec v = load(x + k);
      vlo = v < vlo ? v : vlo;
      vhi = v > vhi ? v : vhi;
    }
    for (int64_t l = 0; l < L; ++l) {
      lo = std::min(lo, vlo[l]);
      hi = std::max(hi, vhi[l]);
    }
  }
  for (; k < n; ++k) {
    lo = std::min(lo, x[k]);
    hi = std::max(hi, x[k]);
  }
}

// ELU+1, E = d: phi = x + 1 where x > 0, else exp(x) (= elu(x) + 1); its derivative 1, else exp(x)
template <typename T>
struct EluRow : RowDefaults {
  int64_t d;
  std::vector<T> x, e, scratch;  // the row, exp(min(x, 0)), x + 1 or g
  explicit EluRow(int64_t d_) : d(d_), x(d_), e(d_), scratch(d_) {}
  int64_t width() const { return d; }
  FW_INLINE void prepare(const T* __restrict__ row) {
    T* __restrict__ xs = x.data();
    for (int64_t k = 0; k < d; ++k) xs[k] = std::min(row[k], T(0));
    exp_row(xs, T(1), T(0), e.data(), d);
    std::copy(row, row + d, xs);
  }
  FW_INLINE void phi(T* __restrict__ out) {
    T* __restrict__ plus_one = scratch.data();
    for (int64_t k = 0; k < d; ++k) plus_one[k] = x[k] + T(1);
    select_positive(x.data(), plus_one, e.data(), out, d);
  }
  FW_INLINE void backward(const T* __restrict__ g, T* __restrict__ dx) {
    T* __restrict__ g_exp = scratch.data();
    for (int64_t k = 0; k < d; ++k) g_exp[k] = g[k] * e[k];
    select_positive(x.data(), g, g_exp, dx, d);
  }
};

// Hedgehog, E = 2d: phi = [softmax(x), softmax(-x)] over the row's d entries, each exp shifted by its half's largest
// argument as torch.softmax is, or both by the middle of the row's range, one exp_pair_lanes for the two, where half
// the range is at most kPairMax; dx = p (g - p . g) - p' (g' - p' . g') for the halves p, p' of phi and g, g' of g
template <typename T>
struct HedgehogRow : RowDefaults {
  int64_t d;
  std::vector<T> p;  // phi [2d]
  explicit HedgehogRow(int64_t d_) : d(d_), p(2 * d_) {}
  int64_t width() const { return 2 * d; }
  FW_INLINE void prepare(const T* __restrict__ x) {
    T lo, hi;
    min_max(x, d, lo, hi);
    T* __restrict__ h = p.data();
    const T middle = T(0.5) * (hi + lo), half = T(0.5) * (hi - lo);
    if (half <= ExpConstants<T>::kPairMax) {  // exp(+-(x - middle)): the halves' shifts cancel in their sums
      exp_pair_row(x, T(1), -middle, T(1), h, h + d, d);
    } else {
      exp_row(x, T(1), -hi, h, d);  // exp(x - max x)
      exp_row(x, T(-1), lo, h + d, d);  // exp(-x - max(-x))
    }
    const T inv = T(1) / sum(h, d), inv_neg = T(1) / sum(h + d, d);
    for (int64_t k = 0; k < d; ++k) {
      h[k] *= inv;
      h[d + k] *= inv_neg;
    }
  }
  FW_INLINE void phi(T* __restrict__ out) const { std::copy(p.begin(), p.end(), out); }
  FW_INLINE void backward(const T* __restrict__ g, T* __restrict__ dx) const {
    const T* __restrict__ h = p.data();
    const T a = dot(h, g, d), b = dot(h + d, g + d, d);
    for (int64_t k = 0; k < d; ++k) dx[k] = h[k] * (g[k] - a) - h[d + k] * (g[d + k] - b);
  }
};

// the norm of a row of phi [E] (norm kSum or kL2)
template <typename T>
FW_INLINE T row_size(const T* row, int64_t E, int64_t norm) {
  return norm == kSum ? sum(row, E) : std::sqrt(dot(row, row, E));
}

// phi of rows [begin, end): X [rows, d] -> P [rows, E], divided by max(norm, eps) with norm kNone (none), kSum (its
// sum) or kL2 (its 2-norm): normalize_function.py's maths, in the same pass
template <typename T, typename Row>
FW_INLINE void forward_rows(Row& map, const T* X, T* P, int64_t norm, double eps, int64_t begin, int64_t end) {
  const int64_t d = map.d, E = map.width();
  for (int64_t n = begin; n < end; ++n) {
    map.prepare(X + n * d);
    T* __restrict__ row = P + n * E;
    map.phi(row);
    if (norm == kNone) continue;
    const T scale = T(1) / std::max(row_size(row, E, norm), T(eps));
    for (int64_t e = 0; e < E; ++e) row[e] *= scale;
  }
}

// dx of rows [begin, end) from G [rows, E] and X [rows, d]. With a norm, G is the gradient of y = phi / c,
// c = max(size, eps), and the row's phi is formed again for the normalisation's backward first
// (normalize_function.py): dphi = (g - y (y . g)) / c for l2, (g - (y . g)) / c for sum, and g / c where the
// size was clamped (c is then the constant eps).
template <typename T, typename Row>
FW_INLINE void backward_rows(Row& map, const T* G, const T* X, T* DX, int64_t norm, double eps, int64_t begin,
                             int64_t end) {
  const int64_t d = map.d, E = map.width();
  std::vector<T> phi_buffer(norm == kNone ? 0 : E), dphi_buffer(norm == kNone ? 0 : E);
  for (int64_t n = begin; n < end; ++n) {
    map.prepare(X + n * d);
    const T* __restrict__ g = G + n * E;
    if (norm != kNone) {
      T* __restrict__ phi = phi_buffer.data();
      T* __restrict__ dphi = dphi_buffer.data();
      map.phi(phi);
      const T size = row_size(phi, E, norm), c = std::max(size, T(eps)), inv = T(1) / c;
      const T y_dot_g = size > T(eps) ? dot(phi, g, E) * inv : T(0);
      if (norm == kL2) {
        const T k = y_dot_g * inv;  // y_e (y . g) = phi_e k
        for (int64_t e = 0; e < E; ++e) dphi[e] = (g[e] - phi[e] * k) * inv;
      } else {
        for (int64_t e = 0; e < E; ++e) dphi[e] = (g[e] - y_dot_g) * inv;
      }
      g = dphi;
    }
    map.backward(g, DX + n * d);
  }
}

}  // namespace fw
