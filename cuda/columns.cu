// Launcher of the column kernel (col_kernel.cuh): dtype and register-tier dispatch.
#include "col_kernel.cuh"
#include "launch.cuh"

namespace fw {

void launch_col(ColMode mode, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& beta, const at::Tensor& alpha, const at::Tensor& state_in,
                const at::Tensor& state_out,
                const at::Tensor& out, const at::Tensor& aux, bool reverse) {
  const int64_t heads = q.size(0) * q.size(1);
  const int T = q.size(2), P = q.size(3), Q = v.size(3);
  if (heads == 0 || Q == 0) return;
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fw_col", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const bool launched = col_tier(P, [&](auto tier) {
      using Tier = decltype(tier);
      const int col_blocks = ceil_div(Q, Tier::kColsPerBlock);
      const ColArgs<scalar_t, acc_t> args{q.data_ptr<scalar_t>(),
                                          k.data_ptr<scalar_t>(),
                                          v.data_ptr<scalar_t>(),
                                          ptr_or_null<scalar_t>(beta),
                                          ptr_or_null<scalar_t>(alpha),
                                          ptr_or_null<acc_t>(state_in),
                                          ptr_or_null<acc_t>(state_out),
                                          ptr_or_null<acc_t>(out),
                                          ptr_or_null<acc_t>(aux),
                                          T, P, Q, col_blocks, reverse};
      const dim3 grid = grid_1d(heads, col_blocks), block(kColWarps * kWarp);
      switch (mode) {
        case ColMode::kSum:
          col_kernel<scalar_t, acc_t, Tier, ColMode::kSum><<<grid, block, 0, stream>>>(args);
          break;
        case ColMode::kDelta:
          col_kernel<scalar_t, acc_t, Tier, ColMode::kDelta><<<grid, block, 0, stream>>>(args);
          break;
        case ColMode::kDeltaGrad:
          col_kernel<scalar_t, acc_t, Tier, ColMode::kDeltaGrad><<<grid, block, 0, stream>>>(args);
          break;
        case ColMode::kGatedDelta:
          col_kernel<scalar_t, acc_t, Tier, ColMode::kGatedDelta><<<grid, block, 0, stream>>>(args);
          break;
        case ColMode::kGatedDeltaGrad:
          col_kernel<scalar_t, acc_t, Tier, ColMode::kGatedDeltaGrad><<<grid, block, 0, stream>>>(args);
          break;
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
    TORCH_CHECK(launched, "fw_fairseq._cuda: the state has ", P, " rows, more than the kernel's ", kMaxE);
  });
}

}  // namespace fw
