// Device helpers shared by the kernels. No torch in the kernel headers (*_kernel.cuh): they also
// compile for the CPU under tests/cuda/emulator, which supplies the CUDA built-ins they use.
#pragma once
#include <type_traits>

namespace fw {

constexpr int kWarp = 32;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Sums each of x[0..N) over the 32 lanes of a warp; every lane ends with the totals. The N
// butterflies are interleaved so their shuffle latencies overlap. All 32 lanes must be active.
template <int N, typename T>
__device__ __forceinline__ void warp_allreduce(T (&x)[N]) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int n = 0; n < N; ++n) x[n] += __shfl_xor_sync(0xffffffffu, x[n], offset);
  }
}

// Calls f(std::integral_constant<int, R>{}) for the smallest listed R with 32 R >= n; false if none
// fits. A lane keeps R entries of a length-n vector in registers, and registers can only be indexed
// by compile-time constants, so R is a template parameter; the tier lists bound the padding waste.
template <int R, int... Rest, typename F>
bool dispatch_tier(int n, F&& f) {
  if (n <= kWarp * R) {
    f(std::integral_constant<int, R>{});
    return true;
  }
  if constexpr (sizeof...(Rest) > 0) {
    return dispatch_tier<Rest...>(n, f);
  } else {
    return false;
  }
}

}  // namespace fw
