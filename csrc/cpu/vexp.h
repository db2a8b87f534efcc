// exp of a row, a vector of lanes at a time, for the feature maps that need it in the CPU kernels (map_rows.h and
// favor_row.h: ELU+1's negative side; Hedgehog's and FAVOR+'s pairs exp(t), exp(-t) from one range reduction).
// std::exp is a call per value that the compiler cannot vectorise (libm's vector forms need -ffast-math): 128 calls
// a row made Hedgehog's map cost more than its products.
//
// exp(x) = 2^n exp(r), n = round(x / ln 2), r = x - n ln 2 (|r| <= ln 2 / 2, ln 2 in two parts so that n ln 2 is
// exact), exp(r) by its Taylor polynomial to a remainder below half an ulp (degree 7 in float32, 13 in float64),
// 2^n written into the exponent bits. n is rounded by adding 1.5 2^p (p the mantissa's bits): the sum's low bits
// are then n itself. Below kLow (exp would be subnormal) the result is 0, above kHigh it is exp(kHigh).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "dpfp_rows.h"

namespace fw {

template <typename T>
struct ExpConstants;

template <>
struct ExpConstants<float> {
  using Int = int32_t;
  static constexpr float kLow = -87.0f, kHigh = 88.0f, kRound = 12582912.0f;  // 1.5 2^23
  static constexpr float kPairMax = 80.0f;  // exp_pair_lanes's |t|: 2^n and 2^-n both normal
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr int kBits = 23, kBias = 127, kDegree = 7;
};

template <>
struct ExpConstants<double> {
  using Int = int64_t;
  static constexpr double kLow = -708.0, kHigh = 709.0, kRound = 6755399441055744.0;  // 1.5 2^52
  static constexpr double kPairMax = 700.0;  // the same in float64
  static constexpr double kLn2Hi = 0.693147180369123816490, kLn2Lo = 1.90821492927058770002e-10;
  static constexpr int kBits = 52, kBias = 1023, kDegree = 13;
};

// 1 / k!, k = 0..13, each the double nearest (float32 rounds them once more)
constexpr double kInverseFactorials[14] = {1.0, 1.0, 0.5, 1.0 / 6, 1.0 / 24, 1.0 / 120, 1.0 / 720, 1.0 / 5040,
                                           1.0 / 40320, 1.0 / 362880, 1.0 / 3628800, 1.0 / 39916800,
                                           1.0 / 479001600, 1.0 / 6227020800};

// exp of each lane of x
template <typename T>
inline __attribute__((always_inline)) typename Lanes<T>::Vec exp_lanes(typename Lanes<T>::Vec x) {
  using C = ExpConstants<T>;
  using Vec = typename Lanes<T>::Vec;
  typedef typename C::Int IntVec __attribute__((vector_size(32)));
  const Vec zero = {}, low = zero + C::kLow, high = zero + C::kHigh;
  const auto below = x < low;  // lanes of -1 where exp(x) is taken as 0
  x = x < low ? low : x;
  x = x > high ? high : x;
  const Vec rounded = x * T(1.4426950408889634) + C::kRound;  // x / ln 2 + 1.5 2^p: n in the low bits
  const Vec n = rounded - C::kRound;
  const Vec r = x - n * C::kLn2Hi - n * C::kLn2Lo;
  Vec p = zero + T(kInverseFactorials[C::kDegree]);  // Horner's, from the highest degree down
  for (int k = C::kDegree - 1; k >= 0; --k) p = p * r + T(kInverseFactorials[k]);
  IntVec bits, scale_bits;
  std::memcpy(&bits, &rounded, sizeof bits);
  const Vec round_constant = zero + C::kRound;
  IntVec round_bits;
  std::memcpy(&round_bits, &round_constant, sizeof round_bits);
  scale_bits = (bits - round_bits + C::kBias) << C::kBits;  // 2^n
  Vec scale;
  std::memcpy(&scale, &scale_bits, sizeof scale);
  const Vec y = p * scale;
  return below ? zero : y;
}

// (exp(t), exp(-t)) of each lane of t, |t| <= kPairMax (2^n and 2^-n both normal, no clamp): one range reduction
// t = n ln 2 + r for both, and exp(r), exp(-r) as E(r) + O(r) and E(r) - O(r), the even and odd parts of
// exp_lanes's polynomial. A division exp(-t) = 1 / exp(t) instead cost FAVOR+'s row more than this whole pair
template <typename T>
inline __attribute__((always_inline)) void exp_pair_lanes(typename Lanes<T>::Vec t, typename Lanes<T>::Vec& pos,
                                                          typename Lanes<T>::Vec& neg) {
  using C = ExpConstants<T>;
  using Vec = typename Lanes<T>::Vec;
  typedef typename C::Int IntVec __attribute__((vector_size(32)));
  static_assert(C::kDegree % 2 == 1, "the odd part ends at the polynomial's degree");
  const Vec zero = {}, round_constant = zero + C::kRound;
  const Vec rounded = t * T(1.4426950408889634) + C::kRound;  // as exp_lanes: n in the low bits
  const Vec n = rounded - C::kRound;
  const Vec r = t - n * C::kLn2Hi - n * C::kLn2Lo, r2 = r * r;
  Vec even = zero + T(kInverseFactorials[C::kDegree - 1]), odd = zero + T(kInverseFactorials[C::kDegree]);
  for (int k = C::kDegree - 3; k >= 0; k -= 2) {  // Horner's in r^2 for both parts
    even = even * r2 + T(kInverseFactorials[k]);
    odd = odd * r2 + T(kInverseFactorials[k + 1]);
  }
  odd = odd * r;
  IntVec bits, round_bits;
  std::memcpy(&bits, &rounded, sizeof bits);
  std::memcpy(&round_bits, &round_constant, sizeof round_bits);
  const IntVec power = bits - round_bits;  // n
  const IntVec up_bits = (power + C::kBias) << C::kBits, down_bits = (C::kBias - power) << C::kBits;
  Vec up, down;
  std::memcpy(&up, &up_bits, sizeof up);
  std::memcpy(&down, &down_bits, sizeof down);
  pos = (even + odd) * up;
  neg = (even - odd) * down;
}

// body(v, j, count) for each vector v of lanes x[j:j + L] of x [n], j = 0, L, 2L, ...; count = L, except for the last
// n mod L values: one vector padded with the first of them (a value the caller's map takes anyway), count = n mod L
template <typename T, typename Body>
inline __attribute__((always_inline)) void lanes_of_row(const T* __restrict__ x, int64_t n, Body body) {
  constexpr int64_t L = Lanes<T>::kWidth;
  int64_t j = 0;
  for (; j + L <= n; j += L) body(load(x + j), j, L);
  if (j < n) {
    T tail[L];
    std::fill(tail, tail + L, x[j]);
    std::memcpy(tail, x + j, (n - j) * sizeof(T));
    body(load(tail), j, n - j);
  }
}

// the first count lanes of v into out
template <typename T>
inline __attribute__((always_inline)) void store_lanes(const typename Lanes<T>::Vec& v, T* __restrict__ out,
                                                       int64_t count) {
  std::memcpy(out, &v, count * sizeof(T));
}

// pos[j] = exp(t) K and neg[j] = exp(-t) K, t = a x[j] + b, j < n, where every |t| <= kPairMax (exp_pair_lanes)
template <typename T>
inline __attribute__((always_inline)) void exp_pair_row(const T* __restrict__ x, T a, T b, T K, T* __restrict__ pos,
                                                        T* __restrict__ neg, int64_t n) {
  using Vec = typename Lanes<T>::Vec;
  lanes_of_row(x, n, [&](Vec v, int64_t j, int64_t count) __attribute__((always_inline)) {
    Vec up, down;
    exp_pair_lanes<T>(v * a + b, up, down);
    store_lanes<T>(up * K, pos + j, count);
    store_lanes<T>(down * K, neg + j, count);
  });
}

// out[j] = exp(a x[j] + b), j < n (a = 1 or -1: Hedgehog's two halves)
template <typename T>
inline __attribute__((always_inline)) void exp_row(const T* __restrict__ x, T a, T b, T* __restrict__ out,
                                                   int64_t n) {
  using Vec = typename Lanes<T>::Vec;
  lanes_of_row(x, n, [&](Vec v, int64_t j, int64_t count) __attribute__((always_inline)) {
    store_lanes<T>(exp_lanes<T>(v * a + b), out + j, count);
  });
}

}  // namespace fw
