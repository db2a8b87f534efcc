// Row-major products of small matrices for the CPU kernels (feature_attend.cpp): through BLAS where the loaded torch
// exports it, else through register-blocked loops.
#pragma once

#include <cstdint>
#include <cstring>

#include "dpfp_rows.h"

// BLAS's Fortran entry points, weak: null where no loaded library defines them (ATen's cpublas does not export its
// own gemm to extensions)
extern "C" {
void sgemm_(const char*, const char*, const int*, const int*, const int*, const float*, const float*, const int*,
            const float*, const int*, const float*, float*, const int*) __attribute__((weak));
void dgemm_(const char*, const char*, const int*, const int*, const int*, const double*, const double*, const int*,
            const double*, const int*, const double*, double*, const int*) __attribute__((weak));
}

namespace fw {

inline bool blas_found() { return sgemm_ != nullptr && dgemm_ != nullptr; }

// column-major BLAS C [m, n] = op(A) op(B); a row-major X [r, c] is the column-major X^T (ld c)
inline void gemm(char ta, char tb, int m, int n, int k, const float* A, int lda, const float* B, int ldb, float* C,
                 int ldc) {
  const float one = 1, zero = 0;
  sgemm_(&ta, &tb, &m, &n, &k, &one, A, &lda, B, &ldb, &zero, C, &ldc);
}
inline void gemm(char ta, char tb, int m, int n, int k, const double* A, int lda, const double* B, int ldb, double* C,
                 int ldc) {
  const double one = 1, zero = 0;
  dgemm_(&ta, &tb, &m, &n, &k, &one, A, &lda, B, &ldb, &zero, C, &ldc);
}

// Row-major products of a head's buffers, through BLAS (column-major: a row-major X [r, c] is the column-major X^T)
// or through the loops below.

// C [m, n] = A [m, k] B [n, k]^T: BLAS, or dpfp_rows.h's feature_scores two rows of A at a time
template <typename T>
inline __attribute__((always_inline)) void mm_abt(int64_t m, int64_t n, int64_t k, const T* A, const T* B, T* C,
                                                  bool blas) {
  if (blas) return gemm('T', 'N', n, m, k, B, k, A, k, C, n);
  int64_t r = 0;
  for (; r + 2 <= m; r += 2) {
    const T* rows[2] = {A + r * k, A + (r + 1) * k};
    fw::feature_scores<T, 2>(rows, B, C + r * n, n, k, k, n);
  }
  if (r < m) {
    const T* rows[1] = {A + r * k};
    fw::feature_scores<T, 1>(rows, B, C + r * n, n, k, k, n);
  }
}

// out [kRows, n] = A [kRows, k] B [k, n] (A's rows at stride k): n is taken in tiles of kTile vectors whose
// kRows x kTile partial sums stay in registers while B's rows stream through (8 of AVX2's 16 at kRows = 4)
constexpr int kTile = 2;

template <typename T, int kRows>
inline __attribute__((always_inline)) void weighted_rows(const T* A, int64_t k, const T* B, int64_t n, T* out) {
  using Vec = typename fw::Lanes<T>::Vec;
  constexpr int64_t L = fw::Lanes<T>::kWidth, W = L * kTile;
  int64_t j = 0;
  for (; j + W <= n; j += W) {
    Vec acc[kRows][kTile] = {};
    for (int64_t i = 0; i < k; ++i) {
      Vec b[kTile];
      for (int v = 0; v < kTile; ++v) b[v] = fw::load(B + i * n + j + v * L);
      for (int r = 0; r < kRows; ++r) {
        const T a = A[r * k + i];
        for (int v = 0; v < kTile; ++v) acc[r][v] += a * b[v];
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int v = 0; v < kTile; ++v) std::memcpy(out + r * n + j + v * L, &acc[r][v], sizeof(Vec));
  }
  for (; j < n; ++j)  // the columns past the last whole tile
    for (int r = 0; r < kRows; ++r) {
      T total = T(0);
      for (int64_t i = 0; i < k; ++i) total += A[r * k + i] * B[i * n + j];
      out[r * n + j] = total;
    }
}

// C [m, n] = A [m, k] B [k, n]: BLAS, or weighted_rows four rows of A at a time
template <typename T>
inline __attribute__((always_inline)) void mm_ab(int64_t m, int64_t n, int64_t k, const T* A, const T* B, T* C,
                                                 bool blas) {
  if (blas) return gemm('N', 'N', n, m, k, B, n, A, k, C, n);
  constexpr int kRows = 4;
  int64_t r = 0;
  for (; r + kRows <= m; r += kRows) weighted_rows<T, kRows>(A + r * k, k, B, n, C + r * n);
  for (; r < m; ++r) weighted_rows<T, 1>(A + r * k, k, B, n, C + r * n);
}

}  // namespace fw
