// Just enough of CUDA to run the kernel headers of csrc/cuda/ on the CPU, for tests on machines without
// a GPU: every CUDA thread is a std::thread, blocks run one after another, a warp shuffle is a
// store, a barrier among the warp's threads, a load and a second barrier, and __syncthreads is a
// barrier among the block's threads. Slow, but it executes the kernels' own indexing, masking and
// control flow; it says nothing about speed, the memory model, register and shared memory limits
// (beyond a launch's threads and grid) or half-precision rounding (emu::Scalar holds a double).
#pragma once
#include <algorithm>
#include <atomic>
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

// The kernels' scalar_t (c10::Half, c10::BFloat16 or float on a GPU) as a class holding a double,
// converted explicitly as c10::Half is, so that the emulation runs the mixed scalar_t / acc_t code.
// Every read of an input element goes through the conversion, which counts NaN reads: the tests'
// inputs hold no NaN but the guard bands around every buffer do, so a nonzero count is a read out
// of bounds, even one whose value the kernel then discards (which a GPU may turn into a fault).
inline std::atomic<long> nan_reads{0};

struct Scalar {
  double x;
  Scalar() = default;
  explicit Scalar(double v) : x(v) {}
  explicit operator double() const {
    if (x != x) nan_reads.fetch_add(1, std::memory_order_relaxed);
    return x;
  }
};
static_assert(sizeof(Scalar) == sizeof(double), "Scalar buffers are double buffers");

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

// What a 1-D launch may ask for on any GPU since sm_30 (cudaErrorInvalidConfiguration otherwise).
constexpr unsigned kMaxThreadsPerBlock = 1024, kMaxGridX = 0x7fffffffu;

// Runs kernel() as grid x threads CUDA threads (1-D grid and blocks). Returns false and runs nothing
// for a configuration the GPU would refuse, so that the harness reports it instead of emulating it.
template <typename Kernel>
bool launch(long long grid_blocks, long long block_threads, Kernel kernel) {
  if (grid_blocks < 1 || grid_blocks > kMaxGridX || block_threads < 1 || block_threads > kMaxThreadsPerBlock) {
    return false;
  }
  const unsigned grid = static_cast<unsigned>(grid_blocks), threads = static_cast<unsigned>(block_threads);
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
  return true;
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
