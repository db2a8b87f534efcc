// Launcher of the decoding-step kernel (step_kernel.cuh).
#include "launch.cuh"
#include "step_kernel.cuh"

namespace fw {

void launch_step(bool delta, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                 const at::Tensor& beta, const at::Tensor& alpha, const at::Tensor& state, const at::Tensor& o) {
  const int64_t heads = q.size(0) * q.size(1);
  const int E = q.size(3), M = v.size(3);
  if (heads == 0 || M == 0) return;
  const int groups = step_groups(E, M);
  TORCH_CHECK(groups * M <= 1024, "fw_fairseq._cuda: M = ", num(M), " is too wide for the step kernel");
  const dim3 grid = grid_1d(heads, 1);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "fw_step", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const size_t smem = step_smem_bytes<acc_t>(E, M, groups);
    const auto kernel = !delta            ? step_kernel<scalar_t, acc_t, false, false>
                        : alpha.defined() ? step_kernel<scalar_t, acc_t, true, true>
                                          : step_kernel<scalar_t, acc_t, true, false>;
    kernel<<<grid, groups * M, smem, stream>>>(q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                                               v.data_ptr<scalar_t>(), ptr_or_null<scalar_t>(beta),
                                               ptr_or_null<scalar_t>(alpha), state.data_ptr<acc_t>(),
                                               o.data_ptr<acc_t>(), E, M, groups);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace fw
