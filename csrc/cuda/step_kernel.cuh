// One decoding step (T = 1), state updated in place. This is memory-bound: the state [E, M] is read
// and written once per token and everything else is O(E + M). So the layout serves coalescing:
// one block per head, thread (g, m) = (threadIdx.x / M, threadIdx.x % M) walks rows g, g + G, ...
// of column m, and consecutive threads touch consecutive addresses of the row-major state. Column
// sums over the G row groups go through shared memory.
//
// Sum rule: one pass, W += k v^T and o = W^T q together. Delta rule: a first pass reads vbar = W^T k
// (the update needs it for every row), the second updates and reads; the second pass's reads of W
// hit L2, the block having just read the same bytes. The gated delta rule decays W by alpha in the
// second pass (W = alpha W + k u) and reads vbar = alpha W^T k, never writing the decay separately.
#pragma once
#include <cstddef>
#include <cstdint>

#include "warp.cuh"

namespace fw {

constexpr int kStepThreads = 256;  // threads per block to aim for

// Sum of x over the G row groups of column m, returned to every thread of the column. part holds
// [G, M] partials; the trailing barrier lets the caller reuse it.
template <typename acc_t>
__device__ acc_t column_sum(acc_t x, acc_t* part, int g, int m, int groups, int M) {
  part[g * M + m] = x;
  __syncthreads();
  acc_t total = 0;
  for (int h = 0; h < groups; ++h) total += part[h * M + m];
  __syncthreads();
  return total;
}

// GATED (only with DELTA): alpha [BH] is read.
template <typename scalar_t, typename acc_t, bool DELTA, bool GATED>
__global__ void step_kernel(const scalar_t* __restrict__ q, const scalar_t* __restrict__ k,
                            const scalar_t* __restrict__ v, const scalar_t* __restrict__ beta,
                            const scalar_t* __restrict__ alpha, acc_t* __restrict__ state,
                            acc_t* __restrict__ o, int E, int M, int groups) {
  static_assert(DELTA || !GATED, "the gate belongs to the delta rule");
  extern __shared__ __align__(16) unsigned char smem_raw[];  // 16-byte aligned for double
  acc_t* qs = reinterpret_cast<acc_t*>(smem_raw);  // [E]
  acc_t* ks = qs + E;                                // [E]
  acc_t* part = ks + E;                              // [groups, M]
  const int64_t bh = blockIdx.x;
  const int g = threadIdx.x / M, m = threadIdx.x % M;  // blockDim.x == groups * M
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    qs[e] = static_cast<acc_t>(q[bh * E + e]);
    ks[e] = static_cast<acc_t>(k[bh * E + e]);
  }
  __syncthreads();

  acc_t* W = state + bh * E * M + m;  // column m; row e at W[e * M]
  acc_t u = static_cast<acc_t>(v[bh * M + m]);
  const acc_t decay = GATED ? static_cast<acc_t>(alpha[bh]) : acc_t(1);
  if constexpr (DELTA) {
    acc_t kw = 0;
#pragma unroll 4
    for (int e = g; e < E; e += groups) kw += ks[e] * W[int64_t(e) * M];
    const acc_t vbar = decay * column_sum(kw, part, g, m, groups, M);
    u = static_cast<acc_t>(beta[bh]) * (u - vbar);
  }
  acc_t qw = 0;
#pragma unroll 4
  for (int e = g; e < E; e += groups) {
    const acc_t w = (GATED ? decay * W[int64_t(e) * M] : W[int64_t(e) * M]) + ks[e] * u;
    W[int64_t(e) * M] = w;
    qw += qs[e] * w;
  }
  qw = column_sum(qw, part, g, m, groups, M);
  if (g == 0) o[bh * M + m] = qw;  // in acc_t, as the forward kernel's outputs
}

// Row groups per block: about kStepThreads threads, but no more groups than rows.
constexpr int step_groups(int E, int M) {
  return ceil_div(kStepThreads, M) < E ? ceil_div(kStepThreads, M) : E;
}

// Dynamic shared memory of step_kernel: qs [E], ks [E], part [groups, M] in acc_t. Shared with the
// emulator (tests/cuda/emulator), which checks that the kernel stays inside it. For E <= 512,
// M <= 160 it is at most 11240 bytes (double, E = 512, M = 127: 3 x 127 threads), under the 48 KiB a
// launch gets without cudaFuncSetAttribute.
template <typename acc_t>
constexpr size_t step_smem_bytes(int E, int M, int groups) {
  return (2 * size_t(E) + size_t(groups) * M) * sizeof(acc_t);
}

}  // namespace fw
