// DPFP's per-row pieces shared by map_rows.h and lazy_step.cpp: r = [relu(x), relu(-x)], phi of a row and its
// backward's dr, the scores of rows against phi of raw keys (phi formed a few keys at a time and never stored), and
// the scores against a cache of features (the other maps' lazy step, feature_attend.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dot.h"

namespace fw {

// 32 bytes of T (GCC/Clang vector extension): one AVX2 register, two SSE2 ones in the baseline clone
template <typename T>
struct Lanes {
  typedef T Vec __attribute__((vector_size(32)));
  static constexpr int64_t kWidth = 32 / sizeof(T);
};

template <typename T>
inline __attribute__((always_inline)) typename Lanes<T>::Vec load(const T* p) {
  typename Lanes<T>::Vec v;
  std::memcpy(&v, p, sizeof v);  // an unaligned load: the rolled rows start anywhere
  return v;
}

// normalisations of phi (normalize_function.py): none, its sum, its 2-norm; the Python side's codes
enum Norm : int64_t { kNone = 0, kSum = 1, kL2 = 2 };

template <typename T>
inline __attribute__((always_inline)) void relu_pair(const T* __restrict__ x, T* __restrict__ r, int64_t d) {
  for (int64_t k = 0; k < d; ++k) {
    const T v = x[k];
    r[k] = v > T(0) ? v : T(0);
    r[k + d] = v < T(0) ? -v : T(0);
  }
}

// r_ext [2d + nu] = [r[w - nu:], r] of a raw key x [d], w = 2d: roll(r, i) is then the plain range r_ext + nu - i
template <typename T>
inline __attribute__((always_inline)) void rolled_row(const T* __restrict__ x, T* __restrict__ r_ext, int64_t d,
                                                      int64_t nu) {
  relu_pair(x, r_ext + nu, d);
  for (int64_t j = 0; j < nu; ++j) r_ext[j] = r_ext[2 * d + j];
}

// norm_of(phi(x), norm) of one raw key x [d] (norm kSum or kL2), phi formed in r_ext [2d + nu] and summed
template <typename T>
inline __attribute__((always_inline)) T phi_size(const T* x, int64_t d, int64_t nu, int64_t norm, T* r_ext) {
  const int64_t w = 2 * d;
  rolled_row(x, r_ext, d, nu);
  T total = T(0);
  for (int64_t i = 1; i <= nu; ++i) {
    const T* __restrict__ r = r_ext + nu;
    const T* __restrict__ rolled = r_ext + nu - i;
    total += norm == kL2 ? lane_sum<T>(w, [&](int64_t j) { return r[j] * rolled[j] * r[j] * rolled[j]; })
                         : lane_sum<T>(w, [&](int64_t j) { return r[j] * rolled[j]; });
  }
  return norm == kL2 ? std::sqrt(total) : total;
}

// phi [w nu] of one row from its r [w]
template <typename T>
inline __attribute__((always_inline)) void phi_row(const T* __restrict__ r, T* __restrict__ p, int64_t w, int64_t nu) {
  for (int64_t i = 1; i <= nu; ++i, p += w) {
    for (int64_t j = 0; j < i; ++j) p[j] = r[j] * r[j - i + w];
    for (int64_t j = i; j < w; ++j) p[j] = r[j] * r[j - i];
  }
}

// dr [w] of one row from g = dphi [w nu]: dr[j] = sum_i g_i[j] r[j - i] + g_i[j + i] r[j + i] (indices mod w), r at
// r_ext + nu with r_ext = [r[w - nu:], r, r[:nu]]. Each vector of dr sums its 2 nu terms in a register and is stored
// once; g_i[j + i] wraps only for the last nu entries, which go one at a time.
template <typename T>
inline __attribute__((always_inline)) void dr_terms(const T* __restrict__ g, const T* __restrict__ r_ext,
                                                    T* __restrict__ dr, int64_t w, int64_t nu) {
  using Vec = typename Lanes<T>::Vec;
  constexpr int64_t L = Lanes<T>::kWidth;
  const T* r = r_ext + nu;
  int64_t j = 0;
  for (; j + L <= w - nu; j += L) {
    Vec acc = {};
    for (int64_t i = 1; i <= nu; ++i) {
      const T* gi = g + (i - 1) * w;
      acc += load(gi + j) * load(r + j - i) + load(gi + j + i) * load(r + j + i);
    }
    std::memcpy(dr + j, &acc, sizeof acc);
  }
  for (; j < w; ++j) {
    T total = T(0);
    for (int64_t i = 1; i <= nu; ++i) {
      const T* gi = g + (i - 1) * w;
      const int64_t ahead = j + i < w ? j + i : j + i - w;  // (j + i) mod w, without a division
      total += gi[j] * r[j - i] + gi[ahead] * r[j + i];
    }
    dr[j] = total;
  }
}

// Keys scored together: each load of the rows' features serves kKeys keys, and the kRows x kKeys partial
// sums stay in registers (8 of AVX2's 16 at two rows). One key at a time, the loads of the rows bounded
// the loop at 53 ns a key (two rows, E = 256); four at a time it takes 34.
constexpr int64_t kKeys = 4;

// scratch that scores_rows needs, in T: kKeys rolled rows r_ext = [r[w - nu:], r], w = 2d
inline int64_t scores_scratch(int64_t d, int64_t nu) { return kKeys * (2 * d + nu); }

// S[q, s0 + k] (row stride t) = the lanes of acc[q][k] summed, plus tail[q][k] (the columns past the last whole vector)
template <typename T, int kRows, int kBlock>
inline __attribute__((always_inline)) void store_block(const typename Lanes<T>::Vec (&acc)[kRows][kBlock],
                                                       const T (&tail)[kRows][kBlock], T* S, int64_t t, int64_t s0) {
  for (int r = 0; r < kRows; ++r)
    for (int64_t k = 0; k < kBlock; ++k) {
      T total = tail[r][k];
      for (int64_t l = 0; l < Lanes<T>::kWidth; ++l) total += acc[r][k][l];
      S[r * t + s0 + k] = total;
    }
}

// scores_rows' S[q, s0 .. s0 + kBlock) from kBlock keys at K (key s at K + s ks)
template <typename T, int kRows, int kBlock>
inline __attribute__((always_inline)) void score_block(const T* const* Q, const T* K, T* S, int64_t t, int64_t s0,
                                                       int64_t ks, int64_t d, int64_t nu, T* scratch) {
  using Vec = typename Lanes<T>::Vec;
  constexpr int64_t L = Lanes<T>::kWidth;
  const int64_t w = 2 * d, row = w + nu, vectorised = w / L * L;
  for (int64_t k = 0; k < kBlock; ++k) rolled_row(K + (s0 + k) * ks, scratch + k * row, d, nu);
  Vec acc[kRows][kBlock] = {};
  T tail[kRows][kBlock] = {};
  for (int64_t i = 1; i <= nu; ++i) {
    const int64_t offset = (i - 1) * w;
    int64_t j = 0;
    for (; j < vectorised; j += L) {
      Vec q[kRows];
      for (int r = 0; r < kRows; ++r) q[r] = load(Q[r] + offset + j);
      for (int64_t k = 0; k < kBlock; ++k) {
        const T* r_ext = scratch + k * row;
        const Vec p = load(r_ext + nu + j) * load(r_ext + nu - i + j);
        for (int r = 0; r < kRows; ++r) acc[r][k] += q[r] * p;
      }
    }
    for (; j < w; ++j)
      for (int64_t k = 0; k < kBlock; ++k) {
        const T* r_ext = scratch + k * row;
        const T p = r_ext[nu + j] * r_ext[nu - i + j];
        for (int r = 0; r < kRows; ++r) tail[r][k] += Q[r][offset + j] * p;
      }
  }
  store_block<T, kRows, kBlock>(acc, tail, S, t, s0);
}

// S [kRows, t] (row stride `stride`) of one head for a cache of the features themselves (ELU+1, FAVOR+), or of a
// training batch's features (feature_attend.cpp): rows Q[q] . K_s, E wide, kKeys keys per load of the rows as above
template <typename T, int kRows, int kBlock>
inline __attribute__((always_inline)) void feature_block(const T* const* Q, const T* K, T* S, int64_t stride,
                                                         int64_t s0, int64_t ks, int64_t E) {
  using Vec = typename Lanes<T>::Vec;
  constexpr int64_t L = Lanes<T>::kWidth;
  const int64_t vectorised = E / L * L;
  Vec acc[kRows][kBlock] = {};
  T tail[kRows][kBlock] = {};
  int64_t j = 0;
  for (; j < vectorised; j += L) {
    Vec q[kRows];
    for (int r = 0; r < kRows; ++r) q[r] = load(Q[r] + j);
    for (int64_t k = 0; k < kBlock; ++k) {
      const Vec p = load(K + (s0 + k) * ks + j);
      for (int r = 0; r < kRows; ++r) acc[r][k] += q[r] * p;
    }
  }
  for (; j < E; ++j)
    for (int64_t k = 0; k < kBlock; ++k)
      for (int r = 0; r < kRows; ++r) tail[r][k] += Q[r][j] * K[(s0 + k) * ks + j];
  store_block<T, kRows, kBlock>(acc, tail, S, stride, s0);
}

// the first t columns of S [kRows, stride]
template <typename T, int kRows>
inline __attribute__((always_inline)) void feature_scores(const T* const* Q, const T* K, T* S, int64_t t, int64_t ks,
                                                          int64_t E, int64_t stride) {
  int64_t s0 = 0;
  for (; s0 + kKeys <= t; s0 += kKeys) feature_block<T, kRows, kKeys>(Q, K, S, stride, s0, ks, E);
  for (; s0 < t; ++s0) feature_block<T, kRows, 1>(Q, K, S, stride, s0, ks, E);
}

// S [kRows, t] (row stride t) of one head: rows Q[q] (E = 2 d nu wide) against the t keys at K (key s at
// K + s ks, d wide). Rows go in pairs (the delta rule's step reads its query and its key), sharing each
// product r[j] r[j - i]: phi_i(k)[j] = r[j] r[(j - i) mod w], and roll(r, i) is r_ext + nu - i.
template <typename T, int kRows>
inline __attribute__((always_inline)) void scores_rows(const T* const* Q, const T* K, T* S, int64_t t, int64_t ks,
                                                       int64_t d, int64_t nu, T* scratch) {
  int64_t s0 = 0;
  for (; s0 + kKeys <= t; s0 += kKeys) score_block<T, kRows, kKeys>(Q, K, S, t, s0, ks, d, nu, scratch);
  for (; s0 < t; ++s0) score_block<T, kRows, 1>(Q, K, S, t, s0, ks, d, nu, scratch);  // the last t mod kKeys
}

}  // namespace fw
