// Launcher of the (gated) delta rule's row kernels (row_kernel.cuh): dtype, register-tier and gate dispatch.
#include <type_traits>

#include "launch.cuh"
#include "row_kernel.cuh"

namespace fw {

void launch_delta_grad_rows(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& beta, const at::Tensor& alpha, const at::Tensor& dout,
                            const at::Tensor& vbar,
                            const at::Tensor& du, const at::Tensor& state0, const at::Tensor& dfinal,
                            const at::Tensor& dq, const at::Tensor& dk, const at::Tensor& dbeta,
                            const at::Tensor& dk_part) {
  const int64_t heads = q.size(0) * q.size(1);
  const int T = q.size(2), E = q.size(3), M = v.size(3);
  if (heads == 0 || E == 0) return;
  const int row_blocks = row_blocks_per_head(E);
  const dim3 grid = grid_1d(heads, row_blocks);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fw_delta_rows", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    RowArgs<scalar_t, acc_t> args{q.data_ptr<scalar_t>(),
                                  k.data_ptr<scalar_t>(),
                                  v.data_ptr<scalar_t>(),
                                  beta.data_ptr<scalar_t>(),
                                  ptr_or_null<scalar_t>(alpha),
                                  dout.data_ptr<scalar_t>(),
                                  vbar.data_ptr<acc_t>(),
                                  du.data_ptr<acc_t>(),
                                  ptr_or_null<acc_t>(state0),
                                  dk_part.data_ptr<acc_t>(),
                                  dq.data_ptr<scalar_t>(),
                                  dk.data_ptr<scalar_t>(),
                                  dbeta.data_ptr<scalar_t>(),
                                  T, E, M, row_blocks};
    const bool launched = row_tier(M, [&](auto tier) {
      constexpr int J = decltype(tier)::J;
      const auto sweeps = [&](auto gated) {
        constexpr bool kGated = decltype(gated)::value;
        delta_rows_kernel<scalar_t, acc_t, J, false, kGated><<<grid, kRowWarps * kWarp, 0, stream>>>(args);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
        args.state = ptr_or_null<acc_t>(dfinal);
        delta_rows_kernel<scalar_t, acc_t, J, true, kGated><<<grid, kRowWarps * kWarp, 0, stream>>>(args);
        C10_CUDA_KERNEL_LAUNCH_CHECK();
      };
      if (alpha.defined()) {
        sweeps(std::true_type{});
      } else {
        sweeps(std::false_type{});
      }
    });
    TORCH_CHECK(launched, "fw_fairseq._cuda: M = ", num(M), " exceeds the delta backward's limit ", num(kMaxM));
  });
}

}  // namespace fw
