// launch_col: the column kernel's mode switch. The kernels themselves are compiled per rule in
// columns_sum.cu, columns_delta.cu and columns_gated.cu (col_launch.cuh).
#include "fast_weight.h"

namespace fw {

void launch_col(ColMode mode, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& beta, const at::Tensor& alpha, const at::Tensor& state_in,
                const at::Tensor& state_out,
                const at::Tensor& out, const at::Tensor& aux, bool reverse) {
  const ColTensors t{q, k, v, beta, alpha, state_in, state_out, out, aux, reverse};
  switch (mode) {
    case ColMode::kSum:
      return launch_col_mode<ColMode::kSum>(t);
    case ColMode::kDelta:
      return launch_col_mode<ColMode::kDelta>(t);
    case ColMode::kDeltaGrad:
      return launch_col_mode<ColMode::kDeltaGrad>(t);
    case ColMode::kGatedDelta:
      return launch_col_mode<ColMode::kGatedDelta>(t);
    case ColMode::kGatedDeltaGrad:
      return launch_col_mode<ColMode::kGatedDeltaGrad>(t);
  }
}

}  // namespace fw
