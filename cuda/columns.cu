// Launcher of the column kernel (col_kernel.cuh): dtype and register-tier dispatch.
#include "col_kernel.cuh"
#include "launch.cuh"

namespace fw {
namespace {

template <typename scalar_t, typename acc_t, ColMode MODE>
void launch_mode(const ColArgs<scalar_t, acc_t>& args, dim3 grid, cudaStream_t stream) {
  const bool launched = col_tier(args.P, [&](auto tier) {
    col_kernel<scalar_t, acc_t, decltype(tier)::value, MODE><<<grid, kColWarps * kWarp, 0, stream>>>(args);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  TORCH_CHECK(launched, "fw_fairseq._cuda: the state has ", args.P, " rows, more than the kernel's 512");
}

}  // namespace

void launch_col(ColMode mode, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& beta, const at::Tensor& state_in, const at::Tensor& state_out,
                const at::Tensor& out, const at::Tensor& aux, bool reverse) {
  const int64_t heads = q.size(0) * q.size(1);
  const int T = q.size(2), P = q.size(3), Q = v.size(3);
  if (heads == 0 || Q == 0) return;
  const int col_blocks = col_blocks_per_head(Q);
  const dim3 grid = grid_1d(heads, col_blocks);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fw_col", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const ColArgs<scalar_t, acc_t> args{q.data_ptr<scalar_t>(),
                                        k.data_ptr<scalar_t>(),
                                        v.data_ptr<scalar_t>(),
                                        ptr_or_null<scalar_t>(beta),
                                        ptr_or_null<acc_t>(state_in),
                                        ptr_or_null<acc_t>(state_out),
                                        ptr_or_null<scalar_t>(out),
                                        ptr_or_null<acc_t>(aux),
                                        T, P, Q, col_blocks, reverse};
    switch (mode) {
      case ColMode::kSum:
        launch_mode<scalar_t, acc_t, ColMode::kSum>(args, grid, stream);
        break;
      case ColMode::kDelta:
        launch_mode<scalar_t, acc_t, ColMode::kDelta>(args, grid, stream);
        break;
      case ColMode::kDeltaGrad:
        launch_mode<scalar_t, acc_t, ColMode::kDeltaGrad>(args, grid, stream);
        break;
    }
  });
}

}  // namespace fw
