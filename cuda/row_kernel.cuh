// The row kernels of the (gated) delta rule's backward: dq, dk and dbeta.
//
// dq_t = W_t do_t and dk_t = G_t u_t - beta_t alpha_t W_{t-1} du_t (G_t = dL/dW_t, u_t = beta_t (v_t - vbar_t),
// alpha = 1 for the ungated rule) are sums over the state's columns. Once u_t and du_t are known
// (from the column kernels' k(Gated)Delta and k(Gated)DeltaGrad passes), every row of W and of G
// evolves on its own:
//   W_t[e, :] = alpha_t W_{t-1}[e, :] + k_t[e] u_t
//   G_{t-1}[e, :] = alpha_t (G_t[e, :] - beta_t k_t[e] du_t) + q_{t-1}[e] do_{t-1}
// so the split here is over rows, again with no communication: a warp owns kRowsPerWarp rows, lane l
// holds columns l, l + 32, ..., l + 32 (J - 1) of each. W needs a forward sweep and G a reverse one:
// the forward sweep writes dq, dbeta and dk's W-part to acc_t scratch, the reverse sweep adds G_t u_t.
// Neither sweep rebuilds a state by subtraction, so errors do not grow with T. Each row's sums are
// needed on one lane only, so they go through a reduce-scatter (7 + 2 shuffles for the forward
// sweep's 8 sums) rather than one butterfly per sum (40).
#pragma once
#include <cstdint>

#include "col_mode.h"
#include "warp.cuh"

namespace fw {

constexpr int kRowWarps = 4;     // warps per block
constexpr int kRowsPerWarp = 4;  // rows per warp: the per-step M-vectors loaded are shared by them

template <typename scalar_t, typename acc_t>
struct RowArgs {
  const scalar_t* q;     // [BH, T, E]
  const scalar_t* k;     // [BH, T, E]
  const scalar_t* v;     // [BH, T, M]
  const scalar_t* beta;  // [BH, T]
  const scalar_t* alpha; // [BH, T], GATED only
  const scalar_t* dout;  // [BH, T, M]
  const acc_t* vbar;     // [BH, T, M]
  const acc_t* du;       // [BH, T, M]
  const acc_t* state;    // [BH, E, M]: W_0 (forward sweep) or dL/dW_T (reverse sweep)
  acc_t* dk_part;        // [BH, T, E]: -beta_t alpha_t W_{t-1} du_t (forward sweep writes, reverse reads)
  scalar_t* dq;          // [BH, T, E]
  scalar_t* dk;          // [BH, T, E]
  scalar_t* dbeta;       // [BH, T]
  int T, E, M, row_blocks;
};

// One time step's inputs as seen by one lane, converted to acc_t.
template <typename acc_t, int J>
struct RowStep {
  acc_t dout[J], u[J], dv_bar[J], du[J];  // dv_bar = v - vbar
  acc_t q[kRowsPerWarp], k[kRowsPerWarp], beta, alpha;
};

template <typename scalar_t, typename acc_t, int J, bool REVERSE, bool GATED>
__global__ void __launch_bounds__(kRowWarps* kWarp) delta_rows_kernel(const RowArgs<scalar_t, acc_t> a) {
  const int lane = threadIdx.x % kWarp;
  const int row0 = ((blockIdx.x % a.row_blocks) * kRowWarps + threadIdx.x / kWarp) * kRowsPerWarp;
  if (row0 >= a.E) return;  // a whole warp leaves: nothing below waits for it
  const int64_t bh = blockIdx.x / a.row_blocks;
  const int T = a.T, E = a.E, M = a.M;
  const int64_t seq_e = bh * T * E, seq_m = bh * T * M;

  acc_t w[kRowsPerWarp][J];  // w[r][j] = state[row0 + r, lane + 32 j]
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int e = row0 + r, m = lane + kWarp * j;
      w[r][j] = (a.state && e < E && m < M) ? a.state[(bh * E + e) * M + m] : acc_t(0);
    }
  }

  // Columns >= M and rows >= E load as zeros, so they add nothing to any sum or update.
  auto load = [&](int t, RowStep<acc_t, J>& in) {
    in.beta = static_cast<acc_t>(a.beta[bh * T + t]);
    in.alpha = GATED ? static_cast<acc_t>(a.alpha[bh * T + t]) : acc_t(1);
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int m = lane + kWarp * j;
      const int64_t idx = seq_m + int64_t(t) * M + m;
      const bool ok = m < M;
      in.dout[j] = ok ? static_cast<acc_t>(a.dout[idx]) : acc_t(0);
      in.dv_bar[j] = ok ? static_cast<acc_t>(a.v[idx]) - a.vbar[idx] : acc_t(0);
      in.du[j] = ok ? a.du[idx] : acc_t(0);
      in.u[j] = in.beta * in.dv_bar[j];
    }
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int e = row0 + r;
      const int64_t idx = seq_e + int64_t(t) * E + e;
      in.k[r] = e < E ? static_cast<acc_t>(a.k[idx]) : acc_t(0);
      in.q[r] = (REVERSE && e < E) ? static_cast<acc_t>(a.q[idx]) : acc_t(0);
    }
  };

  RowStep<acc_t, J> cur, nxt;
  load(REVERSE ? T - 1 : 0, cur);
  for (int n = 0; n < T; ++n) {
    const int t = REVERSE ? T - 1 - n : n;
    load(REVERSE ? max(t - 1, 0) : min(t + 1, T - 1), nxt);  // overlaps this step's arithmetic
    const int64_t out_row = seq_e + int64_t(t) * E + row0;

    if constexpr (!REVERSE) {
      // red[r] = W_{t-1}[e] . du_t (before the update), red[kRowsPerWarp + r] = W_t[e] . do_t (after).
      acc_t red[2 * kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        red[r] = 0;
        red[kRowsPerWarp + r] = 0;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          red[r] += w[r][j] * cur.du[j];
          w[r][j] = GATED ? cur.alpha * w[r][j] + cur.k[r] * cur.u[j] : w[r][j] + cur.k[r] * cur.u[j];
          red[kRowsPerWarp + r] += w[r][j] * cur.dout[j];
        }
      }
      if (row0 == 0) {  // one warp per head also sums dbeta_t = du_t . (v_t - vbar_t) over the columns
        acc_t dbeta[1] = {0};
#pragma unroll
        for (int j = 0; j < J; ++j) dbeta[0] += cur.du[j] * cur.dv_bar[j];
        group_allreduce<kWarp>(dbeta);
        if (lane == 0) a.dbeta[bh * T + t] = static_cast<scalar_t>(dbeta[0]);
      }
      constexpr int kLanes = kWarp / (2 * kRowsPerWarp);  // lanes that receive each total
      const acc_t total = warp_reduce_scatter(red);
      const int which = lane / kLanes, r = which % kRowsPerWarp;
      if (lane % kLanes == 0 && row0 + r < E) {
        if (which < kRowsPerWarp) {
          a.dk_part[out_row + r] = -cur.beta * cur.alpha * total;
        } else {
          a.dq[out_row + r] = static_cast<scalar_t>(total);
        }
      }
    } else {
      // w is G's rows: add o_t's contribution, read G_t[e] . u_t, then step back to G_{t-1}.
      acc_t red[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        red[r] = 0;
#pragma unroll
        for (int j = 0; j < J; ++j) {
          w[r][j] += cur.q[r] * cur.dout[j];
          red[r] += w[r][j] * cur.u[j];
        }
      }
      const acc_t total = warp_reduce_scatter(red);
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const acc_t bk = cur.beta * cur.k[r];
#pragma unroll
        for (int j = 0; j < J; ++j) {
          w[r][j] -= bk * cur.du[j];
          if constexpr (GATED) w[r][j] *= cur.alpha;
        }
      }
      constexpr int kLanes = kWarp / kRowsPerWarp;  // lanes that receive each total
      const int r = lane / kLanes;
      if (lane % kLanes == 0 && row0 + r < E) {
        a.dk[out_row + r] = static_cast<scalar_t>(total + a.dk_part[out_row + r]);
      }
    }
    cur = nxt;
  }
}

// J columns per lane: 32 J >= M. False if M > 160 (kMaxM).
template <int J_>
struct RowTier {
  static constexpr int J = J_, kCapacity = kWarp * J_;
};
static_assert(RowTier<5>::kCapacity == kMaxM, "the row tiers must hold kMaxM columns");

template <typename F>
bool row_tier(int M, F&& f) {
  return dispatch_tier<RowTier<1>, RowTier<2>, RowTier<3>, RowTier<4>, RowTier<5>>(M, f);
}

// Blocks per head for E rows.
constexpr int row_blocks_per_head(int E) { return ceil_div(E, kRowWarps * kRowsPerWarp); }

}  // namespace fw
