// What the two short reads from the raw heads share (feature_attend.cpp: the sum rule's; delta_attend.cpp: the delta
// rule's one chunk): the heads read in their own layout, a head's features formed in a buffer that stays in cache, the
// products of features, the way back from their gradients to dq and dk, and the checked arguments.
// fw_fairseq/ops/README.md §12.
#pragma once

#include "kernels.h"
#include "favor_row.h"
#include "map_rows.h"
#include "products.h"

#include <algorithm>
#include <type_traits>
#include <vector>

namespace fw {

struct Shape {
  // queries, keys, key width, the map (fw::Map), DPFP's nu, phi's norm (fw::Norm)
  int64_t Tq = 0, Tk = 0, d = 0, map = 0, nu = 0, norm = 0;
  double eps = 0;  // the sum rule: the z column's guard (Z_EPS); the delta rule: the normalisation's floor (PHI_EPS)
  int64_t m = 0;  // FAVOR+'s random features
  const void* projection = nullptr;  // FAVOR+'s R [m, d], in q's dtype
  bool blas = false;  // products through BLAS (else the loops of products.h)
};

// The rows of [B, H, T, w] heads in any layout whose w is contiguous (the module's heads are views of [T, B, C]):
// row t of head n = b H + h at data + b sb + h sh + t st. Reading them in place spares a copy of q and k each way,
// and writing dq and dk in q's and k's own layout spares autograd a copy back to [T, B, C].
template <typename P>
struct Heads {
  P* data;
  int64_t H, sb, sh, st;
  P* row(int64_t n, int64_t t) const { return data + (n / H) * sb + (n % H) * sh + t * st; }
};

// the heads of x [B, H, T, w] as Heads<const T> (read) or Heads<T> (written)
template <typename P>
Heads<P> heads_of(const torch::Tensor& x) {
  return Heads<P>{x.data_ptr<std::remove_const_t<P>>(), x.size(1), x.stride(0), x.stride(1), x.stride(2)};
}

// the Tn rows of head n into out [Tn, w]
template <typename T>
FW_INLINE void gather(const Heads<const T>& X, int64_t n, int64_t Tn, int64_t w, T* out) {
  for (int64_t t = 0; t < Tn; ++t) {
    const T* x = X.row(n, t);
    std::copy(x, x + w, out + t * w);
  }
}

template <typename T>
FW_INLINE void scatter(const T* rows, const Heads<T>& X, int64_t n, int64_t Tn, int64_t w) {
  for (int64_t t = 0; t < Tn; ++t) std::copy(rows + t * w, rows + (t + 1) * w, X.row(n, t));
}

// the rows [Tn, width] of those of head n's keys that are padding (pad: [B, T], true at padding; null: none) set to 0
template <typename T>
FW_INLINE void zero_padded(T* rows, const bool* pad, int64_t n, int64_t H, int64_t Tn, int64_t width) {
  if (!pad) return;
  const bool* p = pad + (n / H) * Tn;
  for (int64_t t = 0; t < Tn; ++t)
    if (p[t]) std::fill(rows + t * width, rows + (t + 1) * width, T(0));
}

// A head's buffers and the row map: its raw rows x [Tq + T, d] (queries', then keys'), phi [Tq + T, E] (E the map's
// width; normalised by the Shape's norm), and the scratch of the way back
template <typename T, typename Row>
struct HeadBuffers {
  const Shape& s;
  Row map;
  const int64_t E;
  std::vector<T> x, phi, dphi, coef, dx;

  HeadBuffers(const Shape& shape, Row row)
      : s(shape), map(std::move(row)), E(map.width()), x((s.Tq + s.Tk) * s.d), phi((s.Tq + s.Tk) * E),
        dphi((s.Tq + s.Tk) * E), coef(s.Tk * (s.Tq + s.Tk)), dx((s.Tq + s.Tk) * s.d) {}

  // head n's rows and features; the features of keys at padding zeroed
  // always_inline: called from the FW_CLONES ranges, it must be compiled for each clone's target (AVX2 or not)
  FW_INLINE void load(const Heads<const T>& Q, const Heads<const T>& K, const bool* pad, int64_t n) {
    gather(Q, n, s.Tq, s.d, x.data());
    gather(K, n, s.Tk, s.d, x.data() + s.Tq * s.d);
    map.begin(x.data(), s.Tq + s.Tk, s.Tq);
    forward_rows(map, x.data(), phi.data(), s.norm, s.eps, 0, s.Tq + s.Tk);
    zero_padded(phi.data() + s.Tq * E, pad, n, Q.H, s.Tk, E);
  }

  // out [rows, Tk] = [phi(q) (; phi(k))] phi(k)^T, rows Tq (P) or Tq + Tk (P and X); row t of P keeps s <= t where
  // causal, row s of X keeps r < s
  FW_INLINE void products(T* out, int64_t rows, bool causal) const {
    mm_abt(rows, s.Tk, E, phi.data(), phi.data() + s.Tq * E, out, s.blas);
    for (int64_t t = 0; t < rows; ++t) {
      const int64_t seen = t < s.Tq ? (causal ? t + 1 : s.Tk) : t - s.Tq;
      std::fill(out + t * s.Tk + seen, out + (t + 1) * s.Tk, T(0));
    }
  }

  // dq [Tq, d] and dk [T, d] of head n from dP [Tq, Tk] (0 where masked) and, for the delta rule, dX [Tk, Tk]
  // (strictly lower; null for the sum rule): dphi(q) = dP phi(k), dphi(k) = [dP^T, dX + dX^T] [phi(q); phi(k)],
  // then the map's backward (and the norm's); a padded key's dk is 0 (its phi was the constant 0). After load(n):
  // the map keeps what its begin formed of the head's rows
  FW_INLINE void back(const T* dP, const T* dX, const bool* pad, int64_t n, const Heads<T>& DQ, const Heads<T>& DK) {
    const int64_t Tq = s.Tq, Tk = s.Tk, inner = dX ? Tq + Tk : Tq;
    for (int64_t j = 0; j < Tk; ++j) {  // coef [T, inner] = [dP^T, dX + dX^T]
      T* __restrict__ row = coef.data() + j * inner;
      for (int64_t t = 0; t < Tq; ++t) row[t] = dP[t * Tk + j];
      if (!dX) continue;
      for (int64_t r = 0; r < Tk; ++r) row[Tq + r] = r < j ? dX[j * Tk + r] : r > j ? dX[r * Tk + j] : T(0);
    }
    mm_ab(Tq, E, Tk, dP, phi.data() + Tq * E, dphi.data(), s.blas);
    mm_ab(Tk, E, inner, coef.data(), phi.data(), dphi.data() + Tq * E, s.blas);
    backward_rows(map, dphi.data(), x.data(), dx.data(), s.norm, s.eps, 0, Tq + Tk);
    map.end(dx.data(), Tq + Tk);
    zero_padded(dx.data() + Tq * s.d, pad, n, DQ.H, Tk, s.d);
    scatter(dx.data(), DQ, n, Tq, s.d);
    scatter(dx.data() + Tq * s.d, DK, n, Tk, s.d);
  }
};

// work(row) with the Shape's map as a row form (map_rows.h): the one place where a map's code picks it, so that each
// clone compiles each map's rows inline (a short read's HeadBuffers, a decoding step's two rows)
template <typename T, typename Work>
FW_INLINE void with_row(const Shape& s, Work work) {
  switch (s.map) {
    case kDpfp:
      return work(DpfpRow<T>(s.d, s.nu));
    case kElu:
      return work(EluRow<T>(s.d));
    case kHedgehog:
      return work(HedgehogRow<T>(s.d));
    default:
      return work(FavorRow<T>(static_cast<const T*>(s.projection), s.d, s.m, s.blas));
  }
}

// E, the width of phi of the Shape's map (its row form's)
inline int64_t width(const Shape& s) {
  int64_t E = 0;
  with_row<double>(s, [&](auto row) { E = row.width(); });
  return E;
}

// work(buffers) with the Shape's map as the buffers' row type
template <typename T, typename Work>
FW_INLINE void with_head(const Shape& s, Work work) {
  with_row<T>(s, [&](auto row) __attribute__((always_inline)) {
    HeadBuffers<T, decltype(row)> head(s, std::move(row));
    work(head);
  });
}

// Shape's map fields (map, nu, m, projection) and norm from checked arguments, for heads of width d in dtype `type`;
// kept: FAVOR+'s projection as a contiguous tensor the Shape points into
inline void set_map(Shape& s, int64_t map, int64_t nu, const c10::optional<torch::Tensor>& R, int64_t norm,
                    int64_t d, torch::ScalarType type, torch::Tensor& kept, const char* fn) {
  TORCH_CHECK(map == kDpfp || map == kElu || map == kHedgehog || map == kFavor, fn,
              ": map must be 0 (dpfp), 1 (elu), 2 (hedgehog) or 3 (favor)");
  TORCH_CHECK(map != kDpfp || (nu >= 1 && nu <= 2 * d - 1), fn, ": nu must be in 1..2d-1");
  const bool favor = map == kFavor;
  TORCH_CHECK(!favor || (R && R->defined() && R->dim() == 2 && R->size(0) >= 1 && R->size(1) == d &&
                         R->device().is_cpu() && R->scalar_type() == type),
              fn, ": favor needs its projection, [m, d] in q's dtype");
  TORCH_CHECK(norm == kNone || norm == kSum || norm == kL2, fn, ": norm must be 0 (none), 1 (sum) or 2 (l2)");
  s.d = d;
  s.map = map;
  s.nu = nu;
  s.norm = norm;
  if (favor) {
    kept = R->contiguous();
    s.m = kept.size(0);
    s.projection = kept.data_ptr();
  }
}

// heads a task takes: a head's products are tens of microseconds on a training batch
constexpr int64_t kHeadGrain = 2;

// What both directions of a read take from their arguments, checked: the heads (d contiguous), the key padding mask
// as a contiguous bool [B, T] (or undefined), FAVOR+'s projection (contiguous; undefined for the other maps), the
// shape, and whether the products go to BLAS
struct Call {
  torch::Tensor q, k, pad, projection;
  Shape s;
  int64_t B, H;

  Call(const torch::Tensor& q_, const torch::Tensor& k_, const c10::optional<torch::Tensor>& mask, int64_t map,
       int64_t nu, const c10::optional<torch::Tensor>& R, bool causal, int64_t norm, double eps, bool blas_,
       const char* fn) {
    TORCH_CHECK(q_.device().is_cpu() && k_.device().is_cpu(), fn, ": q and k must be CPU tensors");
    TORCH_CHECK(q_.scalar_type() == k_.scalar_type(), fn, ": q and k must share a dtype");
    TORCH_CHECK(q_.scalar_type() == torch::kFloat || q_.scalar_type() == torch::kDouble, fn,
                ": q and k must be float32 or float64");
    TORCH_CHECK(q_.dim() == 4 && k_.dim() == 4 && q_.size(0) == k_.size(0) && q_.size(1) == k_.size(1) &&
                    q_.size(3) == k_.size(3) && q_.size(3) >= 1,
                fn, ": q and k must be [B, H, Tq, d] and [B, H, T, d]");
    set_map(s, map, nu, R, norm, q_.size(3), q_.scalar_type(), projection, fn);
    TORCH_CHECK(!causal || q_.size(2) == k_.size(2), fn, ": causal needs as many queries as keys");
    TORCH_CHECK(q_.size(2) >= 1 && k_.size(2) >= 1, fn, ": q and k need at least one position");
    // BLAS takes int sizes: a head's [Tq + T, E] features must fit (E <= 2 d nu, 2m for FAVOR+, or 2 d)
    const int64_t E = map == kFavor ? 2 * s.m : 2 * q_.size(3) * std::max<int64_t>(nu, 1);
    TORCH_CHECK((q_.size(2) + k_.size(2)) * E < (int64_t(1) << 31), fn, ": too long for BLAS");
    q = last_contiguous(q_);
    k = last_contiguous(k_);
    if (mask && mask->defined()) {
      TORCH_CHECK(mask->sizes() == torch::IntArrayRef({k.size(0), k.size(2)}), fn, ": key_padding_mask must be [B, T]");
      pad = mask->to(torch::kBool).contiguous();
    }
    s.Tq = q.size(2);
    s.Tk = k.size(2);
    s.eps = eps;
    B = q.size(0);
    H = q.size(1);
    s.blas = blas_ && blas_found();
  }

  const bool* pad_data() const { return pad.defined() ? pad.data_ptr<bool>() : nullptr; }
};

}  // namespace fw
