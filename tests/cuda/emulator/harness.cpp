// C entry points (for ctypes) that run the kernel headers of cuda/ under cuda_emu.h in float64,
// with the launch geometry the launchers in cuda/*.cu use. Returns 0, or -1 if no tier fits.
#include "cuda_emu.h"

#include "col_kernel.cuh"
#include "row_kernel.cuh"
#include "step_kernel.cuh"

namespace fw {
alignas(16) unsigned char smem_raw[1 << 16];  // the step kernel's dynamic shared memory
}

extern "C" {

int emu_col(int mode, const double* q, const double* k, const double* v, const double* beta,
            const double* state_in, double* state_out, double* out, double* aux, int heads, int T, int P,
            int Q, int reverse) {
  using namespace fw;
  const bool ok = col_tier(P, [&](auto tier) {
    using Tier = decltype(tier);
    const int col_blocks = ceil_div(Q, Tier::kColsPerBlock);
    const ColArgs<double, double> a{q, k, v, beta, state_in, state_out, out, aux, T, P, Q, col_blocks, reverse != 0};
    const unsigned grid = heads * col_blocks, block = kColWarps * kWarp;
    switch (static_cast<ColMode>(mode)) {
      case ColMode::kSum:
        emu::launch(grid, block, [&] { col_kernel<double, double, Tier, ColMode::kSum>(a); });
        break;
      case ColMode::kDelta:
        emu::launch(grid, block, [&] { col_kernel<double, double, Tier, ColMode::kDelta>(a); });
        break;
      case ColMode::kDeltaGrad:
        emu::launch(grid, block, [&] { col_kernel<double, double, Tier, ColMode::kDeltaGrad>(a); });
        break;
    }
  });
  return ok ? 0 : -1;
}

int emu_delta_rows(const double* q, const double* k, const double* v, const double* beta, const double* dout,
                   const double* vbar, const double* du, const double* state0, const double* dfinal, double* dk_part,
                   double* dq, double* dk, double* dbeta, int heads, int T, int E, int M) {
  using namespace fw;
  RowArgs<double, double> a{q, k, v, beta, dout, vbar, du, state0, dk_part, dq, dk, dbeta, T, E, M,
                            row_blocks_per_head(E)};
  const unsigned grid = heads * row_blocks_per_head(E);
  const bool ok = row_tier(M, [&](auto tier) {
    constexpr int J = decltype(tier)::J;
    emu::launch(grid, kRowWarps * kWarp, [&] { delta_rows_kernel<double, double, J, false>(a); });
    a.state = dfinal;
    emu::launch(grid, kRowWarps * kWarp, [&] { delta_rows_kernel<double, double, J, true>(a); });
  });
  return ok ? 0 : -1;
}

int emu_step(int delta, const double* q, const double* k, const double* v, const double* beta, double* state,
             double* o, int heads, int E, int M) {
  using namespace fw;
  const int groups = step_groups(E, M);
  if (delta) {
    emu::launch(heads, groups * M, [&] { step_kernel<double, double, true>(q, k, v, beta, state, o, E, M, groups); });
  } else {
    emu::launch(heads, groups * M, [&] { step_kernel<double, double, false>(q, k, v, beta, state, o, E, M, groups); });
  }
  return 0;
}

}  // extern "C"
