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

// Sums each of x[0..N) over the warp (N a power of two <= 32) and returns the total of value
// lane / (32 / N): value n's total lands on lanes n * 32 / N .. (n + 1) * 32 / N - 1. Each halving
// step trades half of a lane's values with its partner, so this costs N - 1 + log2(32 / N)
// shuffles instead of the 5 N of N full butterflies, when each total is needed on one lane only.
// All 32 lanes must be active; x is clobbered.
template <int N, typename T>
__device__ __forceinline__ T warp_reduce_scatter(T (&x)[N]) {
  static_assert(N >= 1 && N <= kWarp && (N & (N - 1)) == 0, "N: a power of two <= 32");
  const int lane = threadIdx.x % kWarp;
#pragma unroll
  for (int half = N / 2, offset = kWarp / 2; half >= 1; half /= 2, offset /= 2) {
    const bool upper = lane & offset;  // upper lanes keep the second half, lower ones the first
#pragma unroll
    for (int i = 0; i < half; ++i) {
      const T send = upper ? x[i] : x[i + half];
      x[i] = (upper ? x[i + half] : x[i]) + __shfl_xor_sync(0xffffffffu, send, offset);
    }
  }
  T total = x[0];
#pragma unroll
  for (int offset = kWarp / N / 2; offset > 0; offset /= 2) total += __shfl_xor_sync(0xffffffffu, total, offset);
  return total;
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
