// Device helpers shared by the kernels. No torch in the kernel headers (*_kernel.cuh): they also
// compile for the CPU under tests/cuda/emulator, which supplies the CUDA built-ins they use.
#pragma once

namespace fw {

constexpr int kWarp = 32;

constexpr int ceil_div(int a, int b) { return (a + b - 1) / b; }

// Sums each of x[0..N) over aligned groups of WIDTH lanes (WIDTH a power of two <= 32); every lane
// ends with its group's totals. The N butterflies are interleaved so their shuffle latencies
// overlap. All 32 lanes must be active.
template <int WIDTH, int N, typename T>
__device__ __forceinline__ void group_allreduce(T (&x)[N]) {
  static_assert(WIDTH >= 1 && WIDTH <= kWarp && (WIDTH & (WIDTH - 1)) == 0, "WIDTH: a power of two <= 32");
#pragma unroll
  for (int offset = WIDTH / 2; offset > 0; offset /= 2) {
#pragma unroll
    for (int n = 0; n < N; ++n) x[n] += __shfl_xor_sync(0xffffffffu, x[n], offset);
  }
}

// Calls f(Tier{}) for the first listed Tier whose Tier::kCapacity >= n; false if none fits. A lane
// keeps its share of a length-n vector in a register array, and registers can only be indexed by
// compile-time constants, so the shapes live in types; the tier lists bound the padding waste.
template <typename Tier, typename... Rest, typename F>
bool dispatch_tier(int n, F&& f) {
  if (n <= Tier::kCapacity) {
    f(Tier{});
    return true;
  }
  if constexpr (sizeof...(Rest) > 0) {
    return dispatch_tier<Rest...>(n, f);
  } else {
    return false;
  }
}

}  // namespace fw
