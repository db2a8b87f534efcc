// The column kernel: every recurrence here that reduces over the state's rows (see ColMode).
//
// Each column m of the state [P, Q] evolves on its own under both update rules, so the work splits
// over columns with no communication. A column lives in the registers of a group of L lanes for
// the whole time loop: lane s of the group holds rows s, s + L, ..., s + L (R - 1), so a dot product
// over P is R fused multiply-adds per lane and a log2(L)-step butterfly within the group. A group
// owns C adjacent columns, a warp 32 / L groups, a block kColWarps warps; there is no shared memory
// and no block barrier. The blocks of one head are adjacent in the grid and read that head's q, k
// (the same for every column) from L1/L2.
//
// Why groups narrower than a warp: with P = 64 over 32 lanes, each lane would hold 2 rows, and the
// 5 shuffles of a full-warp butterfly would outnumber the 4 multiply-adds per column and step; with
// L = 8 lanes of 8 rows, 3 shuffle instructions serve the 4 groups of a warp at once.
#pragma once
#include <cstdint>

#include "col_mode.h"
#include "warp.cuh"

namespace fw {

constexpr int kColWarps = 4;  // warps per block

// L lanes per column, R rows per lane, C columns per group.
template <int L_, int R_, int C_>
struct ColTier {
  static constexpr int L = L_, R = R_, C = C_, kCapacity = L_ * R_;
  static constexpr int kColsPerBlock = kColWarps * (kWarp / L_) * C_;
};

// Tiers by the number of state rows P: E for the forward and the delta rule's column passes, M in
// the sum rule's dq and dk passes. M = 65 and 129 (d_value + 1, the z column) and E = 384 (DPFP
// nu = 3) get tiers of their own. False if P > 512 (kMaxE; the sum rule's P = M <= kMaxM is smaller).
using WidestColTier = ColTier<32, 16, 2>;
static_assert(WidestColTier::kCapacity == kMaxE && kMaxM <= kMaxE, "the column tiers must hold kMaxE rows");

template <typename F>
bool col_tier(int P, F&& f) {
  return dispatch_tier<ColTier<8, 2, 4>, ColTier<8, 4, 4>, ColTier<8, 8, 4>, ColTier<16, 5, 2>, ColTier<16, 8, 2>,
                       ColTier<16, 10, 2>, ColTier<32, 8, 2>, ColTier<32, 12, 2>, WidestColTier>(P, f);
}

template <typename scalar_t, typename acc_t>
struct ColArgs {
  const scalar_t* q;      // [BH, T, P]
  const scalar_t* k;      // [BH, T, P]
  const scalar_t* v;      // [BH, T, Q]
  const scalar_t* beta;   // [BH, T], delta modes only
  const scalar_t* alpha;  // [BH, T], gated modes only
  const acc_t* state_in;  // [BH, P, Q] or null for zeros
  acc_t* state_out;       // [BH, P, Q] or null
  acc_t* out;             // [BH, T, Q] or null; in acc_t: the sum rule's outputs grow like t P
  acc_t* aux;             // [BH, T, Q] or null
  int T, P, Q, col_blocks;
  bool reverse;
};

// One time step's inputs as seen by one lane, converted to acc_t.
template <typename acc_t, int R, int C>
struct ColStep {
  acc_t q[R], k[R], v[C], beta, alpha;
};

// What one lane works on: rows sub, sub + L, ..., sub + L (R - 1) of its group's columns col0 .. col0 + C - 1,
// in head bh.
struct ColLane {
  int64_t bh;
  int sub, col0;
};

// The lane's rows of its columns of state [BH, P, Q] into s[j][i] = state[sub + L i, col0 + j]; zeros where the
// state is null or the element lies outside [P, Q].
template <int L, int R, int C, typename acc_t>
__device__ __forceinline__ void col_load_state(acc_t (&s)[C][R], const acc_t* state, const ColLane& me,
                                               int P, int Q) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int e = me.sub + L * i, m = me.col0 + j;
      s[j][i] = (state && e < P && m < Q) ? state[(me.bh * P + e) * Q + m] : acc_t(0);
    }
  }
}

// col_load_state's inverse: s back into state [BH, P, Q], inside [P, Q] only.
template <int L, int R, int C, typename acc_t>
__device__ __forceinline__ void col_store_state(const acc_t (&s)[C][R], acc_t* state, const ColLane& me,
                                                int P, int Q) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int e = me.sub + L * i, m = me.col0 + j;
      if (e < P && m < Q) state[(me.bh * P + e) * Q + m] = s[j][i];
    }
  }
}

// Step t's inputs from the head's q, k [T, P], v [T, Q], beta and alpha [T] (null where the mode reads none).
// Rows >= P and columns >= Q load as zeros, so they add nothing to any dot product or update; beta and alpha
// are 1 in the modes that do not read them.
template <int L, ColMode MODE, int R, int C, typename scalar_t, typename acc_t>
__device__ __forceinline__ void col_load_step(ColStep<acc_t, R, C>& in, const scalar_t* __restrict__ q,
                                              const scalar_t* __restrict__ k, const scalar_t* __restrict__ v,
                                              const scalar_t* __restrict__ beta, const scalar_t* __restrict__ alpha,
                                              const ColLane& me, int t, int P, int Q) {
  constexpr bool kGated = is_gated(MODE);
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int e = me.sub + L * i;
    in.q[i] = e < P ? static_cast<acc_t>(q[int64_t(t) * P + e]) : acc_t(0);
    in.k[i] = e < P ? static_cast<acc_t>(k[int64_t(t) * P + e]) : acc_t(0);
  }
#pragma unroll
  for (int j = 0; j < C; ++j) {
    in.v[j] = me.col0 + j < Q ? static_cast<acc_t>(v[int64_t(t) * Q + me.col0 + j]) : acc_t(0);
  }
  in.beta = MODE == ColMode::kSum ? acc_t(1) : static_cast<acc_t>(beta[t]);
  in.alpha = kGated ? static_cast<acc_t>(alpha[t]) : acc_t(1);
}

// kSum: s += k_t v_t[m]; out[j] = q_t . s.
template <int L, int R, int C, typename acc_t>
__device__ __forceinline__ void col_sum_step(acc_t (&s)[C][R], const ColStep<acc_t, R, C>& cur, acc_t (&out)[C]) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
    out[j] = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      s[j][i] += cur.k[i] * cur.v[j];
      out[j] += cur.q[i] * s[j][i];
    }
  }
  group_allreduce<L>(out);
}

// k(Gated)Delta: u = beta_t (v_t[m] - alpha_t k_t . s); s = alpha_t s + k_t u; out[j] = q_t . s;
// aux[j] = alpha_t k_t . s_old. k.s_old and q.s_old are reduced together, then q.s_new = alpha_t q.s_old +
// (q.k) u: one butterfly round per step instead of two dependent ones. The gate scales both sums
// (alpha s_old is never formed before the reduction).
template <int L, bool GATED, int R, int C, typename acc_t>
__device__ __forceinline__ void col_delta_step(acc_t (&s)[C][R], const ColStep<acc_t, R, C>& cur, acc_t (&out)[C],
                                               acc_t (&aux)[C]) {
  acc_t red[2 * C + 1];  // [k.s_old for each column, q.s_old for each column, q.k]
  red[2 * C] = 0;
#pragma unroll
  for (int i = 0; i < R; ++i) red[2 * C] += cur.q[i] * cur.k[i];
#pragma unroll
  for (int j = 0; j < C; ++j) {
    red[j] = 0;
    red[C + j] = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      red[j] += cur.k[i] * s[j][i];
      red[C + j] += cur.q[i] * s[j][i];
    }
  }
  group_allreduce<L>(red);
#pragma unroll
  for (int j = 0; j < C; ++j) {
    if constexpr (GATED) {
      red[j] *= cur.alpha;
      red[C + j] *= cur.alpha;
    }
    const acc_t u = cur.beta * (cur.v[j] - red[j]);
#pragma unroll
    for (int i = 0; i < R; ++i) {
      if constexpr (GATED) {
        s[j][i] = cur.alpha * s[j][i] + cur.k[i] * u;
      } else {
        s[j][i] += cur.k[i] * u;
      }
    }
    out[j] = red[C + j] + red[2 * C] * u;
    aux[j] = red[j];
  }
}

// k(Gated)DeltaGrad, s a column of dL/dW_t and v = dL/do: s += q_t v_t[m]; du = k_t . s;
// s = alpha_t (s - beta_t du k_t); out[j] = beta_t du; aux[j] = du.
template <int L, bool GATED, int R, int C, typename acc_t>
__device__ __forceinline__ void col_delta_grad_step(acc_t (&s)[C][R], const ColStep<acc_t, R, C>& cur,
                                                    acc_t (&out)[C], acc_t (&aux)[C]) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
    aux[j] = 0;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      s[j][i] += cur.q[i] * cur.v[j];
      aux[j] += cur.k[i] * s[j][i];
    }
  }
  group_allreduce<L>(aux);
#pragma unroll
  for (int j = 0; j < C; ++j) {
    const acc_t bdu = cur.beta * aux[j];
#pragma unroll
    for (int i = 0; i < R; ++i) {
      s[j][i] -= bdu * cur.k[i];
      if constexpr (GATED) s[j][i] *= cur.alpha;
    }
    out[j] = bdu;
  }
}

// Every lane of the group holds the totals; lane j of the group stores column j of out and aux at step t
// (a register array is only ever indexed by the unrolled, compile-time j). kSum writes no aux.
template <ColMode MODE, int C, typename scalar_t, typename acc_t>
__device__ __forceinline__ void col_store_step(const ColArgs<scalar_t, acc_t>& a, const ColLane& me, int t,
                                               const acc_t (&out)[C], const acc_t (&aux)[C]) {
#pragma unroll
  for (int j = 0; j < C; ++j) {
    if (me.sub == j && me.col0 + j < a.Q) {
      const int64_t idx = (me.bh * a.T + t) * a.Q + me.col0 + j;
      if (a.out) a.out[idx] = out[j];
      if constexpr (MODE != ColMode::kSum) {
        if (a.aux) a.aux[idx] = aux[j];
      }
    }
  }
}

template <typename scalar_t, typename acc_t, typename Tier, ColMode MODE>
__global__ void __launch_bounds__(kColWarps* kWarp) col_kernel(const ColArgs<scalar_t, acc_t> a) {
  constexpr int L = Tier::L, R = Tier::R, C = Tier::C;
  constexpr bool kGated = is_gated(MODE);
  const int lane = threadIdx.x % kWarp;
  const int warp_col0 = ((blockIdx.x % a.col_blocks) * kColWarps + threadIdx.x / kWarp) * (kWarp / L) * C;
  if (warp_col0 >= a.Q) return;  // a whole warp leaves: nothing below waits for it
  const int64_t bh = blockIdx.x / a.col_blocks;
  const int T = a.T, P = a.P, Q = a.Q;
  const ColLane me{bh, lane % L, warp_col0 + (lane / L) * C};  // col0: this lane's group's first column
  const scalar_t* __restrict__ q = a.q + bh * T * P;
  const scalar_t* __restrict__ k = a.k + bh * T * P;
  const scalar_t* __restrict__ v = a.v + bh * T * Q;
  const scalar_t* __restrict__ beta = a.beta ? a.beta + bh * T : nullptr;
  const scalar_t* __restrict__ alpha = a.alpha ? a.alpha + bh * T : nullptr;

  acc_t s[C][R];
  col_load_state<L>(s, a.state_in, me, P, Q);
  ColStep<acc_t, R, C> cur, nxt;
  col_load_step<L, MODE>(cur, q, k, v, beta, alpha, me, a.reverse ? T - 1 : 0, P, Q);
  for (int n = 0; n < T; ++n) {
    const int t = a.reverse ? T - 1 - n : n;
    // Issue the next step's loads before this step's arithmetic so their latency overlaps it
    // (clamped: the last step reloads itself instead of branching).
    col_load_step<L, MODE>(nxt, q, k, v, beta, alpha, me, a.reverse ? max(t - 1, 0) : min(t + 1, T - 1), P, Q);
    acc_t out[C], aux[C];
    if constexpr (MODE == ColMode::kSum) {
      col_sum_step<L>(s, cur, out);
    } else if constexpr (MODE == ColMode::kDelta || MODE == ColMode::kGatedDelta) {
      col_delta_step<L, kGated>(s, cur, out, aux);
    } else {
      col_delta_grad_step<L, kGated>(s, cur, out, aux);
    }
    col_store_step<MODE>(a, me, t, out, aux);
    cur = nxt;
  }
  if (a.state_out) col_store_state<L>(s, a.state_out, me, P, Q);
}

}  // namespace fw
