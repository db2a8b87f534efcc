// Sums over n values in kLanes independent partial sums: a single running sum waits on each add (no
// -ffast-math), which made a 256-long dot of every head the slowest part of a decoding step.
#pragma once

#include <cstdint>

namespace fw {

// sum_i term(i) for i < n
template <typename T, typename Term>
inline __attribute__((always_inline)) T lane_sum(int64_t n, Term term) {
  constexpr int64_t kLanes = 16;
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += term(i + l);
  T total = T(0);
  for (; i < n; ++i) total += term(i);
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

template <typename T>
inline __attribute__((always_inline)) T dot(const T* __restrict__ x, const T* __restrict__ y, int64_t n) {
  return lane_sum<T>(n, [&](int64_t i) { return x[i] * y[i]; });
}

template <typename T>
inline __attribute__((always_inline)) T sum(const T* __restrict__ x, int64_t n) {
  return lane_sum<T>(n, [&](int64_t i) { return x[i]; });
}

}  // namespace fw
