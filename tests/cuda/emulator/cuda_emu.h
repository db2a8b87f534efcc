// Just enough of CUDA to run the kernel headers of cuda/ on the CPU, for tests on machines without
// a GPU: every CUDA thread is a std::thread, blocks run one after another, a warp shuffle is a
// store, a barrier among the warp's threads, a load and a second barrier, and __syncthreads is a
// barrier among the block's threads. Slow, but it executes the kernels' own indexing, masking and
// control flow; it says nothing about speed, the memory model or half-precision conversions.
#pragma once
#include <algorithm>
#include <barrier>
#include <memory>
#include <thread>
#include <vector>

struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline thread_local EmuDim3 threadIdx, blockIdx;
inline EmuDim3 blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

using std::max;
using std::min;

namespace emu {

struct Warp {
  explicit Warp(std::ptrdiff_t lanes) : barrier(lanes) {}
  std::barrier<> barrier;
  double slot[32];  // holds a float or a double exactly
};

struct Block {
  explicit Block(unsigned threads) : barrier(threads) {
    for (unsigned w = 0; w * 32 < threads; ++w) {
      warps.push_back(std::make_unique<Warp>(std::min(32u, threads - 32 * w)));
    }
  }
  std::barrier<> barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

inline thread_local Block* block = nullptr;

// Runs kernel() as grid x threads CUDA threads (1-D grid and blocks).
template <typename Kernel>
void launch(unsigned grid, unsigned threads, Kernel kernel) {
  gridDim = {grid, 1, 1};
  blockDim = {threads, 1, 1};
  for (unsigned b = 0; b < grid; ++b) {
    Block blk(threads);
    std::vector<std::thread> pool;
    for (unsigned t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        threadIdx = {t, 0, 0};
        blockIdx = {b, 0, 0};
        block = &blk;
        kernel();
      });
    }
    for (auto& th : pool) th.join();
  }
}

}  // namespace emu

template <typename T>
T __shfl_xor_sync(unsigned, T x, int offset) {
  const unsigned lane = threadIdx.x % 32;
  emu::Warp& warp = *emu::block->warps[threadIdx.x / 32];
  warp.slot[lane] = static_cast<double>(x);
  warp.barrier.arrive_and_wait();
  const T y = static_cast<T>(warp.slot[lane ^ offset]);
  warp.barrier.arrive_and_wait();
  return y;
}

inline void __syncthreads() { emu::block->barrier.arrive_and_wait(); }
