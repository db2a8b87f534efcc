// DPFP's per-row pieces shared by dpfp.cpp and lazy_step.cpp: r = [relu(x), relu(-x)] and the scores of
// rows against phi of raw keys, phi formed a key at a time and never stored.
#pragma once

#include <cstdint>

namespace fw {

template <typename T>
inline __attribute__((always_inline)) void relu_pair(const T* __restrict__ x, T* __restrict__ r, int64_t d) {
  for (int64_t k = 0; k < d; ++k) {
    const T v = x[k];
    r[k] = v > T(0) ? v : T(0);
    r[k + d] = v < T(0) ? -v : T(0);
  }
}

// S [kRows, t] (row stride t) of one head: rows Q[q] (E wide) against the t keys at K (key s at K + s ks, d wide).
// Rows go in pairs (the delta rule's step reads its query and its key), sharing each product r[j] r[j - i];
// kLanes independent partial sums per row let the dot vectorise without -ffast-math.
template <typename T, int kRows>
inline __attribute__((always_inline)) void scores_rows(const T* const* Q, const T* K, T* S, int64_t t, int64_t ks,
                                                       int64_t d, int64_t nu, T* r_ext) {
  constexpr int64_t kLanes = 16;
  const int64_t w = 2 * d;
  const T* __restrict__ r = r_ext + nu;  // r_ext = [r[w - nu:], r], so roll(r, i) is r_ext + nu - i
  for (int64_t s = 0; s < t; ++s) {
    relu_pair(K + s * ks, r_ext + nu, d);
    for (int64_t j = 0; j < nu; ++j) r_ext[j] = r_ext[w + j];
    T lanes[kRows][kLanes] = {};
    T tail[kRows] = {};
    for (int64_t i = 1; i <= nu; ++i) {
      const T* __restrict__ rolled = r_ext + nu - i;
      int64_t j = 0;
      for (; j + kLanes <= w; j += kLanes)
        for (int64_t l = 0; l < kLanes; ++l) {
          const T p = r[j + l] * rolled[j + l];
          for (int q = 0; q < kRows; ++q) lanes[q][l] += Q[q][(i - 1) * w + j + l] * p;
        }
      for (; j < w; ++j)
        for (int q = 0; q < kRows; ++q) tail[q] += Q[q][(i - 1) * w + j] * (r[j] * rolled[j]);
    }
    for (int q = 0; q < kRows; ++q) {
      T acc = tail[q];
      for (int64_t l = 0; l < kLanes; ++l) acc += lanes[q][l];
      S[q * t + s] = acc;
    }
  }
}

}  // namespace fw
