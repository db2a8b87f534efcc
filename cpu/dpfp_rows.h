// DPFP's per-row pieces shared by dpfp.cpp and lazy_step.cpp: r = [relu(x), relu(-x)] and the scores of
// rows against phi of raw keys, phi formed a few keys at a time and never stored.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace fw {

template <typename T>
inline __attribute__((always_inline)) void relu_pair(const T* __restrict__ x, T* __restrict__ r, int64_t d) {
  for (int64_t k = 0; k < d; ++k) {
    const T v = x[k];
    r[k] = v > T(0) ? v : T(0);
    r[k + d] = v < T(0) ? -v : T(0);
  }
}

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

// Keys scored together: each load of the rows' features serves kKeys keys, and the kRows x kKeys partial
// sums stay in registers (8 of AVX2's 16 at two rows). One key at a time, the loads of the rows bounded
// the loop at 53 ns a key (two rows, E = 256).
constexpr int64_t kKeys = 4;

// scratch that scores_rows needs, in T: kKeys rolled rows r_ext = [r[w - nu:], r], w = 2d
inline int64_t scores_scratch(int64_t d, int64_t nu) { return kKeys * (2 * d + nu); }

// S [kRows, t] (row stride t) of one head: rows Q[q] (E = 2 d nu wide) against the t keys at K (key s at
// K + s ks, d wide). Rows go in pairs (the delta rule's step reads its query and its key), sharing each
// product r[j] r[j - i]: phi_i(k)[j] = r[j] r[(j - i) mod w], and roll(r, i) is r_ext + nu - i.
template <typename T, int kRows>
inline __attribute__((always_inline)) void scores_rows(const T* const* Q, const T* K, T* S, int64_t t, int64_t ks,
                                                       int64_t d, int64_t nu, T* scratch) {
  using Vec = typename Lanes<T>::Vec;
  constexpr int64_t L = Lanes<T>::kWidth;
  const int64_t w = 2 * d, row = w + nu, vectorised = w / L * L;
  for (int64_t s0 = 0; s0 < t; s0 += kKeys) {
    const int64_t keys = std::min(kKeys, t - s0);
    for (int64_t k = 0; k < kKeys; ++k) {
      T* r_ext = scratch + k * row;
      if (k < keys) {
        relu_pair(K + (s0 + k) * ks, r_ext + nu, d);
        for (int64_t j = 0; j < nu; ++j) r_ext[j] = r_ext[w + j];
      } else {  // a short last block: zeros score 0 and are not stored (garbage could hold slow denormals)
        std::fill(r_ext, r_ext + row, T(0));
      }
    }
    Vec acc[kRows][kKeys] = {};
    T tail[kRows][kKeys] = {};
    for (int64_t i = 1; i <= nu; ++i) {
      const int64_t offset = (i - 1) * w;
      int64_t j = 0;
      for (; j < vectorised; j += L) {
        Vec q[kRows];
        for (int r = 0; r < kRows; ++r) q[r] = load(Q[r] + offset + j);
        for (int64_t k = 0; k < kKeys; ++k) {
          const T* r_ext = scratch + k * row;
          const Vec p = load(r_ext + nu + j) * load(r_ext + nu - i + j);
          for (int r = 0; r < kRows; ++r) acc[r][k] += q[r] * p;
        }
      }
      for (; j < w; ++j)
        for (int64_t k = 0; k < kKeys; ++k) {
          const T* r_ext = scratch + k * row;
          const T p = r_ext[nu + j] * r_ext[nu - i + j];
          for (int r = 0; r < kRows; ++r) tail[r][k] += Q[r][offset + j] * p;
        }
    }
    for (int r = 0; r < kRows; ++r)
      for (int64_t k = 0; k < keys; ++k) {
        T total = tail[r][k];
        for (int64_t l = 0; l < L; ++l) total += acc[r][k][l];
        S[r * t + s0 + k] = total;
      }
  }
}

}  // namespace fw
