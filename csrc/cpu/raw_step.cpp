// Generation's decoder self-attention step from the raw rows (decoder_state.raw_causal_step): raw_lazy_step takes q, k
// [B, H, 1, d] instead of phi; per head the map's row form (map_rows.h) forms phi(q) and phi(k), normalised by the
// rule's norm, the sum rule's values get their z column (u = [v; 1]) and its read is divided by it, then the step of
// lazy_head.h; DPFP's cache keeps the raw key, the other maps' their phi(k). In Python those are six small ops and
// their tensors a layer-step (phi of q and k, the z column's append and division).
// Traced (lazy_head.h's StepArgs): a beam reorder copies no cache row. Hypothesis b gathers its positions from the
// rows the lineage names into a buffer that stays in cache, steps over it there, and appends its own row in row b of
// the caches, which no other hypothesis's lineage names at that position. Before, every reorder wrote each
// hypothesis's whole cache to a spare storage (a third or more of a beam-4 layer-step's memory traffic).
#include "attend_heads.h"
#include "lazy_head.h"

#include <ATen/Parallel.h>

#include <vector>

namespace {

using fw::HeadCaches;
using fw::lazy_head;
using fw::Step;
using fw::StepArgs;

// raw_lazy_step's rows: q, k [B, H, 1, d] and v [B, H, 1, D] in any layout whose last dim is contiguous (the
// module's heads are views of [1, B, C]: no copies)
template <typename T>
struct RawRows {
  fw::Heads<const T> q, k, v;
};

// raw_lazy_step's heads [begin, end): Step's O is [B H, D] (D = M - 1 with the z column); map: the row form of s's map
template <typename T, typename Row>
inline __attribute__((always_inline)) void raw_rows(const Step<T>& a, const RawRows<T>& r, const fw::Shape& s,
                                                    Row& map, bool z, T z_eps, int64_t begin, int64_t end) {
  const int64_t d = s.d, E = map.width(), D = z ? a.M - 1 : a.M;
  std::vector<T> x(2 * d), phi(2 * E), v(a.M), o(a.M), u(a.M);
  std::vector<T> S(2 * a.t), r_ext(a.nu ? fw::scores_scratch(d, a.nu) : 0), past(2 * a.M);
  // traced: head n's t + 1 positions of keys [t + 1, C] and writes [t + 1, M], gathered, then its own
  std::vector<T> keys(a.traced ? (a.t + 1) * a.d : 0), writes(a.traced ? (a.t + 1) * a.M : 0);
  for (int64_t n = begin; n < end; ++n) {
    HeadCaches<T> c(a, n);
    const int64_t b = n / a.H, h = n % a.H;
    T *key_out = nullptr, *write_out = nullptr;  // traced: where the step's own row goes
    if (a.traced) {
      for (int64_t p = 0; p < a.t; ++p) {
        const int64_t row = fw::traced_row(a, b, p);
        const T* key = a.K + row * a.kc.b + h * a.kc.h + p * a.kc.s;
        const T* write = a.W + row * a.wc.b + h * a.wc.h + p * a.wc.s;
        std::copy(key, key + a.d, keys.data() + p * a.d);
        std::copy(write, write + a.M, writes.data() + p * a.M);
        if (h == 0) a.lineage_out[b * (a.t + 1) + p] = row;
      }
      if (h == 0) a.lineage_out[b * (a.t + 1) + a.t] = b;
      key_out = c.Kout + a.t * a.koc.s;
      write_out = c.Wout + a.t * a.woc.s;
      c.K = c.Kout = keys.data();  // the step reads and appends in the buffers: no copy of the past
      c.W = c.Wout = writes.data();
    }
    const int64_t ks = a.traced ? a.d : a.kc.s, ws = a.traced ? a.M : a.wc.s;
    const int64_t kos = a.traced ? a.d : a.koc.s, wos = a.traced ? a.M : a.woc.s;
    std::copy(r.q.row(n, 0), r.q.row(n, 0) + d, x.data());  // [q; k]: row 0 the query's (FAVOR+'s shift)
    std::copy(r.k.row(n, 0), r.k.row(n, 0) + d, x.data() + d);
    map.begin(x.data(), 2, 1);
    fw::forward_rows(map, x.data(), phi.data(), s.norm, s.eps, 0, 2);  // [phi(q); phi(k)] [2, E]
    std::copy(r.v.row(n, 0), r.v.row(n, 0) + D, v.data());
    if (z) v[D] = T(1);
    // DPFP's cache (nu > 0) keeps the raw key and scales its write by phi's norm; a cache of features keeps phi(k)
    lazy_head(phi.data(), phi.data() + E, v.data(), a.beta ? a.beta + n : nullptr, c.K, ks, c.W, ws, c.C, a.cc.s,
              c.Kout, kos, c.Wout, wos, a.nu ? x.data() + d : phi.data() + E, a.nu ? s.norm : fw::kNone, a.eps, a.t,
              a.d, a.nu, a.M, o.data(), u.data(), S.data(), r_ext.data(), past.data());
    if (a.traced) {
      std::copy(keys.data() + a.t * a.d, keys.data() + (a.t + 1) * a.d, key_out);
      std::copy(writes.data() + a.t * a.M, writes.data() + (a.t + 1) * a.M, write_out);
    }
    T* __restrict__ out = a.O + n * D;
    const T s_t = z ? o[D] + z_eps : T(1);  // y = numerator / (z . phi(q) + Z_EPS), as divide_by_z divides
    for (int64_t m = 0; m < D; ++m) out[m] = o[m] / s_t;
  }
  fw::stream_fence();
}

template <typename T>
inline __attribute__((always_inline)) void raw_range_of(const Step<T>& a, const RawRows<T>& r, const fw::Shape& s,
                                                        bool z, T z_eps, int64_t b, int64_t e) {
  fw::with_row<T>(s, [&](auto map) __attribute__((always_inline)) { raw_rows(a, r, s, map, z, z_eps, b, e); });
}
FW_CLONES void raw_range(const Step<float>& a, const RawRows<float>& r, const fw::Shape& s, bool z, float z_eps,
                         int64_t b, int64_t e) {
  raw_range_of(a, r, s, z, z_eps, b, e);
}
FW_CLONES void raw_range(const Step<double>& a, const RawRows<double>& r, const fw::Shape& s, bool z, double z_eps,
                         int64_t b, int64_t e) {
  raw_range_of(a, r, s, z, z_eps, b, e);
}

}  // namespace

// The view of t + 1 positions of cache [B', H, t, W] in its own storage, where that storage has room for position t of
// every row without touching another's (cache_storage.room's layout: [B', H, cap, W] from offset 0, cap > t); else
// undefined. The step appends there and makes the views itself: as two Python views they cost a few us a step.
torch::Tensor grown_in_place(const torch::Tensor& cache) {
  const int64_t B = cache.size(0), H = cache.size(1), t = cache.size(2), W = cache.size(3);
  const int64_t cap = W > 0 ? cache.stride(1) / W : 0;
  const bool room = cache.stride(3) == 1 && cache.stride(2) == W && cache.stride(1) == cap * W &&
                    cache.stride(0) == H * cache.stride(1) && cache.storage_offset() == 0 && cap > t &&
                    cache.storage().nbytes() >= static_cast<size_t>(B * cache.stride(0) * cache.element_size());
  return room ? cache.as_strided({B, H, t + 1, W}, cache.strides()) : torch::Tensor();
}

// q, k [B, H, 1, d] raw rows; v [B, H, 1, D]; the map (feature_attend_forward's codes, nu, projection) and norm, the
// normalisation of phi(q) and phi(k) (0 for the sum rule), with eps; z_column: the sum rule's (writes M = D + 1 wide,
// the read divided by z . phi(q) + z_eps); keys [B', H, t, C] (C = d for DPFP, else E) and writes [B', H, t, M],
// views of storages with room for position t (else nothing runs and o is undefined: the caller lays them out anew).
// Each hypothesis appends its row at position t of the storages, in its own row b; with a reorder (order [B]) or a
// lineage [B'', t] the step is traced -> (o [B, H, 1, D]; traced: the lineage [B, t + 1] for the next step, else
// None; the views of t + 1 positions of keys and writes)
std::tuple<torch::Tensor, c10::optional<torch::Tensor>, torch::Tensor, torch::Tensor> raw_lazy_step(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const c10::optional<torch::Tensor>& beta,
    const torch::Tensor& keys, const torch::Tensor& writes, const c10::optional<torch::Tensor>& decay, int64_t map,
    int64_t nu, const c10::optional<torch::Tensor>& projection, const c10::optional<torch::Tensor>& order,
    const c10::optional<torch::Tensor>& lineage, int64_t norm, double eps, bool z_column, double z_eps) {
  TORCH_CHECK(keys.dim() == 4 && writes.dim() == 4,
              "raw_lazy_step: keys and writes must be [B, H, t, d] and [B, H, t, M]");
  const torch::Tensor keys_out = grown_in_place(keys), writes_out = grown_in_place(writes);
  if (!keys_out.defined() || !writes_out.defined())
    return {torch::Tensor(), c10::nullopt, torch::Tensor(), torch::Tensor()};
  const int64_t D = writes.size(3) - (z_column ? 1 : 0);
  // outs in the caches' own storages: traced wherever a reorder or a lineage says where the positions are
  const StepArgs a(keys, writes, v, beta, decay, order, keys_out, writes_out, true, D, "raw_lazy_step", lineage);
  TORCH_CHECK(q.dim() == 4 && q.sizes() == k.sizes() && q.size(0) == a.B && q.size(1) == a.H && q.size(2) == 1 &&
                  q.scalar_type() == a.type && k.scalar_type() == a.type && v.scalar_type() == a.type,
              "raw_lazy_step: q and k must be [B, H, 1, d] and v [B, H, 1, D] of the keys' dtype");
  fw::Shape s;
  torch::Tensor kept;
  fw::set_map(s, map, nu, projection, norm, q.size(3), a.type, kept, "raw_lazy_step");
  s.eps = eps;
  const int64_t E = fw::width(s);
  const int64_t cached_nu = map == fw::kDpfp ? nu : 0;  // DPFP's cache keeps the raw keys, the others' phi
  TORCH_CHECK(a.C == (cached_nu ? s.d : E), "raw_lazy_step: keys must be [B, H, t, ", cached_nu ? s.d : E, "]");
  const auto qc = last_contiguous(q), kc = last_contiguous(k), vc = last_contiguous(v);
  auto o = torch::empty({a.B, a.H, 1, D}, keys.options());
  AT_DISPATCH_FLOATING_TYPES(a.type, "raw_lazy_step", [&] {
    const auto step = a.step<scalar_t>(nullptr, nullptr, nullptr, nullptr, o.data_ptr<scalar_t>(), nullptr, norm, eps,
                                       cached_nu);
    const RawRows<scalar_t> rows{fw::heads_of<const scalar_t>(qc), fw::heads_of<const scalar_t>(kc),
                                 fw::heads_of<const scalar_t>(vc)};
    at::parallel_for(0, a.B * a.H, 4, [&](int64_t b, int64_t e) {
      raw_range(step, rows, s, z_column, static_cast<scalar_t>(z_eps), b, e);
    });
  });
  if (a.traced) return {o, a.lo, keys_out, writes_out};
  return {o, c10::nullopt, keys_out, writes_out};
}
