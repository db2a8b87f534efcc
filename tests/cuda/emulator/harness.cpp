// C entry points (for ctypes) that run the kernel headers of csrc/cuda/ under cuda_emu.h in float64
// (scalar_t emu::Scalar, acc_t double), with the launch geometry the launchers in csrc/cuda/*.cu use.
// Returns kOk or one of the errors below.
#include <cstring>
#include <type_traits>

#include "cuda_emu.h"

#include "col_kernel.cuh"
#include "row_kernel.cuh"
#include "step_kernel.cuh"

namespace fw {
// The step kernel's dynamic shared memory. Only the first step_smem_bytes (what the launcher asks
// for) exist on a GPU; all of it starts as 0xff bytes (NaN as float and as double), so a read beyond
// the launch's size (or before the kernel's own write) poisons the output, and a write beyond it is
// reported.
alignas(16) unsigned char smem_raw[1 << 16];
}

namespace {
constexpr int kOk = 0, kNoTier = -1, kLaunchRefused = -2, kSharedOverrun = -3, kNanRead = -4;
constexpr unsigned char kCanary = 0xff;
using fw::ColArgs, fw::RowArgs, emu::Scalar;

const Scalar* in(const double* p) { return reinterpret_cast<const Scalar*>(p); }
Scalar* out(double* p) { return reinterpret_cast<Scalar*>(p); }

// kOk, or kNanRead if an input element read since the last call was NaN (out of bounds).
int reads_ok() { return emu::nan_reads.exchange(0) == 0 ? kOk : kNanRead; }
}  // namespace

extern "C" {

int emu_col(int mode, const double* q, const double* k, const double* v, const double* beta,
            const double* alpha, const double* state_in, double* state_out, double* o, double* aux, int heads,
            int T, int P, int Q, int reverse) {
  using namespace fw;
  if (heads == 0 || Q == 0) return kOk;  // as launch_col
  emu::nan_reads = 0;
  bool launched = false;
  const bool ok = col_tier(P, [&](auto tier) {
    using Tier = decltype(tier);
    const int col_blocks = ceil_div(Q, Tier::kColsPerBlock);
    const ColArgs<Scalar, double> a{in(q),     in(k), in(v), in(beta), in(alpha),  state_in,    state_out,
                                    o,         aux,   T,     P,        Q,          col_blocks, reverse != 0};
    const int64_t grid = int64_t(heads) * col_blocks;
    const unsigned block = kColWarps * kWarp;
    const auto run = [&](auto mode_constant) {
      constexpr ColMode kMode = decltype(mode_constant)::value;
      launched = emu::launch(grid, block, [&] { col_kernel<Scalar, double, Tier, kMode>(a); });
    };
    switch (static_cast<ColMode>(mode)) {
      case ColMode::kSum:
        run(std::integral_constant<ColMode, ColMode::kSum>{});
        break;
      case ColMode::kDelta:
        run(std::integral_constant<ColMode, ColMode::kDelta>{});
        break;
      case ColMode::kDeltaGrad:
        run(std::integral_constant<ColMode, ColMode::kDeltaGrad>{});
        break;
      case ColMode::kGatedDelta:
        run(std::integral_constant<ColMode, ColMode::kGatedDelta>{});
        break;
      case ColMode::kGatedDeltaGrad:
        run(std::integral_constant<ColMode, ColMode::kGatedDeltaGrad>{});
        break;
    }
  });
  return !ok ? kNoTier : !launched ? kLaunchRefused : reads_ok();
}

int emu_delta_rows(const double* q, const double* k, const double* v, const double* beta, const double* alpha,
                   const double* dout, const double* vbar, const double* du, const double* state0,
                   const double* dfinal, double* dk_part, double* dq, double* dk, double* dbeta, int heads, int T,
                   int E, int M) {
  using namespace fw;
  if (heads == 0 || E == 0) return kOk;  // as launch_delta_grad_rows
  emu::nan_reads = 0;
  RowArgs<Scalar, double> a{in(q),   in(k),   in(v),   in(beta),   in(alpha), in(dout), vbar,
                            du,      state0,  dk_part, out(dq),    out(dk),   out(dbeta),
                            T,       E,       M,       row_blocks_per_head(E)};
  const int64_t grid = int64_t(heads) * row_blocks_per_head(E);
  bool launched = false;
  const bool ok = row_tier(M, [&](auto tier) {
    constexpr int J = decltype(tier)::J;
    const auto sweeps = [&](auto gated) {
      constexpr bool kGated = decltype(gated)::value;
      launched = emu::launch(grid, kRowWarps * kWarp, [&] { delta_rows_kernel<Scalar, double, J, false, kGated>(a); });
      a.state = dfinal;
      launched = launched &&
                 emu::launch(grid, kRowWarps * kWarp, [&] { delta_rows_kernel<Scalar, double, J, true, kGated>(a); });
    };
    if (alpha) {
      sweeps(std::true_type{});
    } else {
      sweeps(std::false_type{});
    }
  });
  return !ok ? kNoTier : !launched ? kLaunchRefused : reads_ok();
}

int emu_step(int delta, const double* q, const double* k, const double* v, const double* beta, const double* alpha,
             double* state, double* o, int heads, int E, int M) {
  using namespace fw;
  if (heads == 0 || M == 0) return kOk;  // as launch_step
  const int groups = step_groups(E, M);
  const size_t smem = step_smem_bytes<double>(E, M, groups);
  if (smem > sizeof(smem_raw)) return kLaunchRefused;
  std::memset(smem_raw, kCanary, sizeof(smem_raw));  // also poisons reads before the kernel's writes
  emu::nan_reads = 0;
  const auto kernel = [&] {
    if (delta && alpha) {
      step_kernel<Scalar, double, true, true>(in(q), in(k), in(v), in(beta), in(alpha), state, o, E, M, groups);
    } else if (delta) {
      step_kernel<Scalar, double, true, false>(in(q), in(k), in(v), in(beta), nullptr, state, o, E, M, groups);
    } else {
      step_kernel<Scalar, double, false, false>(in(q), in(k), in(v), nullptr, nullptr, state, o, E, M, groups);
    }
  };
  if (!emu::launch(heads, groups * M, kernel)) return kLaunchRefused;
  for (size_t i = smem; i < sizeof(smem_raw); ++i) {
    if (smem_raw[i] != kCanary) return kSharedOverrun;
  }
  return reads_ok();
}

// The binding's limits on E and M (fw::kMaxE, fw::kMaxM), which the extension exports as MAX_E, MAX_M.
void emu_limits(int* max_e, int* max_m) {
  *max_e = fw::kMaxE;
  *max_m = fw::kMaxM;
}

// The step launcher's block for E, M: threads, and dynamic shared memory bytes for acc_t = double
// (the widest), so that tests can check every shape the binding accepts against the launch limits.
void emu_step_geometry(int E, int M, int* threads, long long* smem) {
  using namespace fw;
  const int groups = step_groups(E, M);
  *threads = groups * M;
  *smem = static_cast<long long>(step_smem_bytes<double>(E, M, groups));
}

}  // extern "C"
