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

// What one lane works on: rows row0 .. row0 + kRowsPerWarp - 1 of head bh (its warp's), columns lane,
// lane + 32, ..., lane + 32 (J - 1) of each; seq_e and seq_m are the head's offsets in the [BH, T, E] and
// [BH, T, M] sequences.
struct RowLane {
  int64_t bh, seq_e, seq_m;
  int lane, row0;
};

// The lane's part of a.state [BH, E, M] into w[r][j] = state[row0 + r, lane + 32 j]; zeros where the state
// is null or the element lies outside [E, M].
template <int J, typename scalar_t, typename acc_t>
__device__ __forceinline__ void row_load_state(acc_t (&w)[kRowsPerWarp][J], const RowArgs<scalar_t, acc_t>& a,
                                               const RowLane& me) {
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int j = 0; j < J; ++j) {
      const int e = me.row0 + r, m = me.lane + kWarp * j;
      w[r][j] = (a.state && e < a.E && m < a.M) ? a.state[(me.bh * a.E + e) * a.M + m] : acc_t(0);
    }
  }
}

// Step t's inputs. Columns >= M and rows >= E load as zeros, so they add nothing to any sum or update;
// only the reverse sweep reads q.
template <bool REVERSE, bool GATED, int J, typename scalar_t, typename acc_t>
__device__ __forceinline__ void row_load_step(RowStep<acc_t, J>& in, const RowArgs<scalar_t, acc_t>& a,
                                              const RowLane& me, int t) {
  in.beta = static_cast<acc_t>(a.beta[me.bh * a.T + t]);
  in.alpha = GATED ? static_cast<acc_t>(a.alpha[me.bh * a.T + t]) : acc_t(1);
#pragma unroll
  for (int j = 0; j < J; ++j) {
    const int m = me.lane + kWarp * j;
    const int64_t idx = me.seq_m + int64_t(t) * a.M + m;
    const bool ok = m < a.M;
    in.dout[j] = ok ? static_cast<acc_t>(a.dout[idx]) : acc_t(0);
    in.dv_bar[j] = ok ? static_cast<acc_t>(a.v[idx]) - a.vbar[idx] : acc_t(0);
    in.du[j] = ok ? a.du[idx] : acc_t(0);
    in.u[j] = in.beta * in.dv_bar[j];
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int e = me.row0 + r;
    const int64_t idx = me.seq_e + int64_t(t) * a.E + e;
    in.k[r] = e < a.E ? static_cast<acc_t>(a.k[idx]) : acc_t(0);
    in.q[r] = (REVERSE && e < a.E) ? static_cast<acc_t>(a.q[idx]) : acc_t(0);
  }
}

// dbeta_t = du_t . (v_t - vbar_t), summed over the columns by the whole warp; lane 0 writes it.
template <int J, typename scalar_t, typename acc_t>
__device__ __forceinline__ void row_dbeta(const RowStep<acc_t, J>& cur, const RowArgs<scalar_t, acc_t>& a,
                                          const RowLane& me, int t) {
  acc_t dbeta[1] = {0};
#pragma unroll
  for (int j = 0; j < J; ++j) dbeta[0] += cur.du[j] * cur.dv_bar[j];
  group_allreduce<kWarp>(dbeta);
  if (me.lane == 0) a.dbeta[me.bh * a.T + t] = static_cast<scalar_t>(dbeta[0]);
}

// The forward sweep's step t, w holding W's rows: W_t = alpha_t W_{t-1} + k_t u_t; writes dq_t = W_t do_t and
// dk_part_t = -beta_t alpha_t W_{t-1} du_t for the warp's rows.
template <bool GATED, int J, typename scalar_t, typename acc_t>
__device__ __forceinline__ void row_forward_step(acc_t (&w)[kRowsPerWarp][J], const RowStep<acc_t, J>& cur,
                                                 const RowArgs<scalar_t, acc_t>& a, const RowLane& me, int t) {
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
  if (me.row0 == 0) row_dbeta(cur, a, me, t);  // one warp per head also sums dbeta_t
  constexpr int kLanes = kWarp / (2 * kRowsPerWarp);  // lanes that receive each total
  const acc_t total = warp_reduce_scatter(red);
  const int which = me.lane / kLanes, r = which % kRowsPerWarp;
  const int64_t out_row = me.seq_e + int64_t(t) * a.E + me.row0;
  if (me.lane % kLanes == 0 && me.row0 + r < a.E) {
    if (which < kRowsPerWarp) {
      a.dk_part[out_row + r] = -cur.beta * cur.alpha * total;
    } else {
      a.dq[out_row + r] = static_cast<scalar_t>(total);
    }
  }
}

// The reverse sweep's step t, w holding G's rows: add o_t's contribution (G_t), read G_t[e] . u_t, then step
// back to G_{t-1} = alpha_t (G_t - beta_t k_t du_t); writes dk_t = G_t u_t + dk_part_t for the warp's rows.
template <bool GATED, int J, typename scalar_t, typename acc_t>
__device__ __forceinline__ void row_reverse_step(acc_t (&w)[kRowsPerWarp][J], const RowStep<acc_t, J>& cur,
                                                 const RowArgs<scalar_t, acc_t>& a, const RowLane& me, int t) {
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
  const int r = me.lane / kLanes;
  const int64_t out_row = me.seq_e + int64_t(t) * a.E + me.row0;
  if (me.lane % kLanes == 0 && me.row0 + r < a.E) {
    a.dk[out_row + r] = static_cast<scalar_t>(total + a.dk_part[out_row + r]);
  }
}

template <typename scalar_t, typename acc_t, int J, bool REVERSE, bool GATED>
__global__ void __launch_bounds__(kRowWarps* kWarp) delta_rows_kernel(const RowArgs<scalar_t, acc_t> a) {
  const int lane = threadIdx.x % kWarp;
  const int row0 = ((blockIdx.x % a.row_blocks) * kRowWarps + threadIdx.x / kWarp) * kRowsPerWarp;
  if (row0 >= a.E) return;  // a whole warp leaves: nothing below waits for it
  const int64_t bh = blockIdx.x / a.row_blocks;
  const int T = a.T;
  const RowLane me{bh, bh * T * a.E, bh * T * a.M, lane, row0};

  acc_t w[kRowsPerWarp][J];
  row_load_state(w, a, me);
  RowStep<acc_t, J> cur, nxt;
  row_load_step<REVERSE, GATED>(cur, a, me, REVERSE ? T - 1 : 0);
  for (int n = 0; n < T; ++n) {
    const int t = REVERSE ? T - 1 - n : n;
    row_load_step<REVERSE, GATED>(nxt, a, me, REVERSE ? max(t - 1, 0) : min(t + 1, T - 1));  // overlaps this step
    if constexpr (REVERSE) {
      row_reverse_step<GATED>(w, cur, a, me, t);
    } else {
      row_forward_step<GATED>(w, cur, a, me, t);
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
