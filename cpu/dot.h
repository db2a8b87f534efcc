// x . y over n values with kLanes independent partial sums: a single running sum waits on each add
// (no -ffast-math), which made a 256-long dot of every head the slowest part of a decoding step.
#pragma once

#include <cstdint>

namespace fw {

template <typename T>
inline __attribute__((always_inline)) T dot(const T* __restrict__ x, const T* __restrict__ y, int64_t n) {
  constexpr int64_t kLanes = 16;
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t l = 0; l < kLanes; ++l) lanes[l] += x[i + l] * y[i + l];
  T total = T(0);
  for (; i < n; ++i) total += x[i] * y[i];
  for (int64_t l = 0; l < kLanes; ++l) total += lanes[l];
  return total;
}

}  // namespace fw
