// The column kernel: every recurrence here that reduces over the state's rows (see ColMode).
//
// Each column m of the state [P, Q] evolves on its own under both update rules, so the work splits
// over columns with no communication: a warp owns kColsPerWarp adjacent columns and keeps them in
// registers for the whole time loop; lane l holds rows l, l + 32, ..., l + 32 (R - 1). A dot
// product over P is R fused multiply-adds per lane and one warp butterfly, so there is no shared
// memory and no block barrier. Blocks of kColWarps warps tile Q; the blocks of one head are adjacent
// in the grid and read that head's q, k (the same for every column) from L1/L2.
#pragma once
#include <cstdint>

#include "col_mode.h"
#include "warp.cuh"

namespace fw {

constexpr int kColWarps = 4;     // warps per block
constexpr int kColsPerWarp = 2;  // columns per warp: q, k loads and q.k are shared by them

template <typename scalar_t, typename acc_t>
struct ColArgs {
  const scalar_t* q;       // [BH, T, P]
  const scalar_t* k;       // [BH, T, P]
  const scalar_t* v;       // [BH, T, Q]
  const scalar_t* beta;    // [BH, T], delta modes only
  const acc_t* state_in;   // [BH, P, Q] or null for zeros
  acc_t* state_out;        // [BH, P, Q] or null
  scalar_t* out;           // [BH, T, Q] or null
  acc_t* aux;              // [BH, T, Q] or null
  int T, P, Q, col_blocks;
  bool reverse;
};

// One time step's inputs as seen by one lane, converted to acc_t.
template <typename acc_t, int R>
struct ColStep {
  acc_t q[R], k[R], v[kColsPerWarp], beta;
};

template <typename scalar_t, typename acc_t, int R, ColMode MODE>
__global__ void __launch_bounds__(kColWarps* kWarp) col_kernel(const ColArgs<scalar_t, acc_t> a) {
  const int lane = threadIdx.x % kWarp;
  const int col0 = ((blockIdx.x % a.col_blocks) * kColWarps + threadIdx.x / kWarp) * kColsPerWarp;
  if (col0 >= a.Q) return;  // a whole warp leaves: nothing below waits for it
  const int64_t bh = blockIdx.x / a.col_blocks;
  const int T = a.T, P = a.P, Q = a.Q;
  const scalar_t* __restrict__ q = a.q + bh * T * P;
  const scalar_t* __restrict__ k = a.k + bh * T * P;
  const scalar_t* __restrict__ v = a.v + bh * T * Q;
  const scalar_t* __restrict__ beta = a.beta ? a.beta + bh * T : nullptr;

  acc_t s[kColsPerWarp][R];  // s[j][i] = state[lane + 32 i, col0 + j]
#pragma unroll
  for (int j = 0; j < kColsPerWarp; ++j) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int e = lane + kWarp * i, m = col0 + j;
      s[j][i] = (a.state_in && e < P && m < Q) ? a.state_in[(bh * P + e) * Q + m] : acc_t(0);
    }
  }

  // Rows >= P and columns >= Q load as zeros, so they add nothing to any dot product or update.
  auto load = [&](int t, ColStep<acc_t, R>& in) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int e = lane + kWarp * i;
      in.q[i] = e < P ? static_cast<acc_t>(q[int64_t(t) * P + e]) : acc_t(0);
      in.k[i] = e < P ? static_cast<acc_t>(k[int64_t(t) * P + e]) : acc_t(0);
    }
#pragma unroll
    for (int j = 0; j < kColsPerWarp; ++j) {
      in.v[j] = col0 + j < Q ? static_cast<acc_t>(v[int64_t(t) * Q + col0 + j]) : acc_t(0);
    }
    in.beta = MODE == ColMode::kSum ? acc_t(1) : static_cast<acc_t>(beta[t]);
  };

  ColStep<acc_t, R> cur, nxt;
  load(a.reverse ? T - 1 : 0, cur);
  for (int n = 0; n < T; ++n) {
    const int t = a.reverse ? T - 1 - n : n;
    // Issue the next step's loads before this step's arithmetic so their latency overlaps it
    // (clamped: the last step reloads itself instead of branching).
    load(a.reverse ? max(t - 1, 0) : min(t + 1, T - 1), nxt);

    acc_t out[kColsPerWarp], aux[kColsPerWarp];
    if constexpr (MODE == ColMode::kSum) {
#pragma unroll
      for (int j = 0; j < kColsPerWarp; ++j) {
        out[j] = 0;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          s[j][i] += cur.k[i] * cur.v[j];
          out[j] += cur.q[i] * s[j][i];
        }
      }
      warp_allreduce(out);
    } else if constexpr (MODE == ColMode::kDelta) {
      // k.s_old and q.s_old are reduced together, then q.s_new = q.s_old + (q.k) u: one butterfly
      // round per step instead of two dependent ones.
      acc_t red[2 * kColsPerWarp + 1];
      red[2 * kColsPerWarp] = 0;
#pragma unroll
      for (int i = 0; i < R; ++i) red[2 * kColsPerWarp] += cur.q[i] * cur.k[i];
#pragma unroll
      for (int j = 0; j < kColsPerWarp; ++j) {
        red[j] = 0;
        red[kColsPerWarp + j] = 0;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          red[j] += cur.k[i] * s[j][i];
          red[kColsPerWarp + j] += cur.q[i] * s[j][i];
        }
      }
      warp_allreduce(red);
#pragma unroll
      for (int j = 0; j < kColsPerWarp; ++j) {
        const acc_t u = cur.beta * (cur.v[j] - red[j]);
#pragma unroll
        for (int i = 0; i < R; ++i) s[j][i] += cur.k[i] * u;
        out[j] = red[kColsPerWarp + j] + red[2 * kColsPerWarp] * u;
        aux[j] = red[j];
      }
    } else {  // kDeltaGrad: s is column m of dL/dW_t, v is dL/do
#pragma unroll
      for (int j = 0; j < kColsPerWarp; ++j) {
        aux[j] = 0;
#pragma unroll
        for (int i = 0; i < R; ++i) {
          s[j][i] += cur.q[i] * cur.v[j];
          aux[j] += cur.k[i] * s[j][i];
        }
      }
      warp_allreduce(aux);
#pragma unroll
      for (int j = 0; j < kColsPerWarp; ++j) {
        const acc_t bdu = cur.beta * aux[j];
#pragma unroll
        for (int i = 0; i < R; ++i) s[j][i] -= bdu * cur.k[i];
        out[j] = bdu;
      }
    }

    // Every lane holds the totals; lane j stores column j (a register array is only ever indexed
    // by the unrolled, compile-time j).
#pragma unroll
    for (int j = 0; j < kColsPerWarp; ++j) {
      if (lane == j && col0 + j < Q) {
        const int64_t idx = (bh * T + t) * Q + col0 + j;
        if (a.out) a.out[idx] = static_cast<scalar_t>(out[j]);
        if constexpr (MODE != ColMode::kSum) {
          if (a.aux) a.aux[idx] = aux[j];
        }
      }
    }
    cur = nxt;
  }

  if (a.state_out) {
#pragma unroll
    for (int j = 0; j < kColsPerWarp; ++j) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int e = lane + kWarp * i, m = col0 + j;
        if (e < P && m < Q) a.state_out[(bh * P + e) * Q + m] = s[j][i];
      }
    }
  }
}

// Register tiers R for P state rows: P = 384 (DPFP nu = 3) and M = 65, 129 (d_value + 1, the z
// column) get their own. False if P > 512.
template <typename F>
bool col_tier(int P, F&& f) {
  return dispatch_tier<1, 2, 3, 4, 5, 8, 12, 16>(P, f);
}

// Blocks per head for Q columns.
constexpr int col_blocks_per_head(int Q) { return ceil_div(Q, kColWarps * kColsPerWarp); }

}  // namespace fw
