// The feature maps a row at a time, as the CPU kernels take them (dpfp.cpp, feature_attend.cpp), and the row loops
// with phi's normalisation (normalize_function.py) that run any of them.
//
// A row map is a struct with scratch for one row: prepare(x) reads a raw row x [d] once, phi(out) writes its features
// [width()] unnormalised, backward(g, dx) writes dx [d] from g = dphi [width()] of the row last prepared. It is made
// once per parallel task (its buffers), and its member functions are always_inline: they must be compiled inside
// each FW_CLONES clone (kernels.h) that calls them. Each map is the same function as its PyTorch form in
// fw_fairseq/ops/feature_maps.py; the kernels' codes for them are cpu_extension.KERNEL_MAPS's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dot.h"
#include "dpfp_rows.h"
#include "vexp.h"

#define FW_INLINE inline __attribute__((always_inline))

namespace fw {

enum Map : int64_t { kDpfp = 0, kElu = 1, kHedgehog = 2 };

// DPFP-nu, E = 2 d nu: phi_i[j] = r[j] r[(j - i) mod w], r = [relu(x), relu(-x)], w = 2d (dpfp_rows.h);
// dx[k] = dr[k] where x[k] > 0, -dr[k + d] where x[k] < 0, else 0 (relu's gradient at 0, as autograd's)
template <typename T>
struct DpfpRow {
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

// ELU+1, E = d: phi = x + 1 where x > 0, else exp(x) (= elu(x) + 1); its derivative 1, else exp(x)
template <typename T>
struct EluRow {
  int64_t d;
  std::vector<T> x, e;  // the row, exp(min(x, 0))
  explicit EluRow(int64_t d_) : d(d_), x(d_), e(d_) {}
  int64_t width() const { return d; }
  FW_INLINE void prepare(const T* row) {
    for (int64_t k = 0; k < d; ++k) x[k] = std::min(row[k], T(0));
    exp_row(x.data(), T(1), T(0), e.data(), d);
    std::copy(row, row + d, x.data());
  }
  FW_INLINE void phi(T* out) const {
    for (int64_t k = 0; k < d; ++k) out[k] = x[k] > T(0) ? x[k] + T(1) : e[k];
  }
  FW_INLINE void backward(const T* g, T* dx) const {
    for (int64_t k = 0; k < d; ++k) dx[k] = x[k] > T(0) ? g[k] : g[k] * e[k];
  }
};

// Hedgehog, E = 2d: phi = [softmax(x), softmax(-x)] over the row's d entries, each exp shifted by its half's largest
// argument as torch.softmax is; dx = p (g - p . g) - p' (g' - p' . g') for the halves p, p' of phi and g, g' of g
template <typename T>
struct HedgehogRow {
  int64_t d;
  std::vector<T> p;  // phi [2d]
  explicit HedgehogRow(int64_t d_) : d(d_), p(2 * d_) {}
  int64_t width() const { return 2 * d; }
  FW_INLINE void prepare(const T* x) {
    const auto [lo, hi] = std::minmax_element(x, x + d);
    exp_row(x, T(1), -*hi, p.data(), d);  // exp(x - max x)
    exp_row(x, T(-1), *lo, p.data() + d, d);  // exp(-x - max(-x))
    for (int64_t half = 0; half < 2; ++half) {
      T* h = p.data() + half * d;
      const T inv = T(1) / sum(h, d);
      for (int64_t k = 0; k < d; ++k) h[k] *= inv;
    }
  }
  FW_INLINE void phi(T* out) const { std::copy(p.begin(), p.end(), out); }
  FW_INLINE void backward(const T* g, T* dx) const {
    const T* q = p.data() + d;
    const T a = dot(p.data(), g, d), b = dot(q, g + d, d);
    for (int64_t k = 0; k < d; ++k) dx[k] = p[k] * (g[k] - a) - q[k] * (g[k + d] - b);
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
