// Host helpers shared by the launchers (*.cu): tensor pointers, grids.
#pragma once
#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>

#include <cstdint>

#include "fast_weight.h"
#include "warp.cuh"

namespace fw {

template <typename T>
T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.data_ptr<T>() : nullptr;
}

// A (heads x blocks-per-head) launch as a 1-D grid, blocks of one head adjacent so that they run
// together and share that head's inputs through L2.
inline dim3 grid_1d(int64_t heads, int blocks_per_head) {
  const int64_t n = heads * blocks_per_head;
  TORCH_CHECK(n < (int64_t(1) << 31), "fw_fairseq._cuda: grid of ", num(n), " blocks is too large");
  return dim3(static_cast<unsigned>(n));
}

}  // namespace fw
