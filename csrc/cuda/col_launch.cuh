// The column kernel's launcher for one mode (dtype and register-tier dispatch). Each mode's
// instantiations are compiled in their rule's own file (columns_sum.cu, columns_delta.cu,
// columns_gated.cu), so that a parallel build (ninja, MAX_JOBS) compiles them at once: in one file the
// 4 dtypes x 9 tiers x 5 modes = 180 kernels were one long serial nvcc run.
#pragma once
#include "col_kernel.cuh"
#include "launch.cuh"

namespace fw {

template <ColMode kMode>
void launch_col_mode(const ColTensors& t) {
  const int64_t heads = t.q.size(0) * t.q.size(1);
  const int T = t.q.size(2), P = t.q.size(3), Q = t.v.size(3);
  if (heads == 0 || Q == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, t.q.scalar_type(), "fw_col", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const bool launched = col_tier(P, [&](auto tier) {
      using Tier = decltype(tier);
      const int col_blocks = ceil_div(Q, Tier::kColsPerBlock);
      const ColArgs<scalar_t, acc_t> args{t.q.data_ptr<scalar_t>(),
                                          t.k.data_ptr<scalar_t>(),
                                          t.v.data_ptr<scalar_t>(),
                                          ptr_or_null<scalar_t>(t.beta),
                                          ptr_or_null<scalar_t>(t.alpha),
                                          ptr_or_null<acc_t>(t.state_in),
                                          ptr_or_null<acc_t>(t.state_out),
                                          ptr_or_null<acc_t>(t.out),
                                          ptr_or_null<acc_t>(t.aux),
                                          T, P, Q, col_blocks, t.reverse};
      const dim3 grid = grid_1d(heads, col_blocks), block(kColWarps * kWarp);
      col_kernel<scalar_t, acc_t, Tier, kMode><<<grid, block, 0, stream>>>(args);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    TORCH_CHECK(launched, "fw_fairseq._cuda: the state has ", num(P), " rows, more than the kernel's ", num(kMaxE));
  });
}

}  // namespace fw
