// Generation's cross-attention read of a cached source from the raw query rows (fw_fairseq/decoding/source_memory.py's
// read_source with phi of the queries and the z column's division, the same function), in one call: in Python the
// query's phi, its normalisation, the per-sentence regrouping of the beams, the two products and the division are
// about eight small ops a layer-step.
// Per hypothesis b and head h, reading the source row r = b / beam (a sentence's beams share its row):
//   cache form [R, H, S, E + M] (short sources: the keys' phi and the effective writes): o = sum_s (phi(q) . k_s) u_s
//   memory form [R, H, E, M]: o = phi(q) W
// phi(q) by the map's row form (map_rows.h), normalised by norm; with the z column (the sum rule, M = D + 1) the read
// is divided by its last entry + z_eps.
#include "attend_heads.h"
#include "dot.h"
#include "kernels.h"

#include <ATen/Parallel.h>

#include <vector>

namespace {

struct Source {
  int64_t R, H, rows, M, beam;  // rows: S (cache form) or E (memory form)
  bool cache, z;
};

template <typename T, typename Row>
inline __attribute__((always_inline)) void read_rows(const fw::Heads<const T>& Q, const T* src, T* out,
                                                     const fw::Shape& s, const Source& a, Row& map, T z_eps,
                                                     int64_t begin, int64_t end) {
  const int64_t d = s.d, E = map.width(), width = a.cache ? E + a.M : a.M, D = a.z ? a.M - 1 : a.M;
  std::vector<T> x(d), phi(E), o(a.M);
  for (int64_t n = begin; n < end; ++n) {
    const int64_t b = n / a.H, h = n % a.H;
    std::copy(Q.row(n, 0), Q.row(n, 0) + d, x.data());
    map.begin(x.data(), 1, 1);  // a query's row (FAVOR+'s shift)
    fw::forward_rows(map, x.data(), phi.data(), s.norm, s.eps, 0, 1);
    const T* __restrict__ head = src + ((b / a.beam) * a.H + h) * a.rows * width;
    T* __restrict__ acc = o.data();
    for (int64_t m = 0; m < a.M; ++m) acc[m] = T(0);
    for (int64_t r = 0; r < a.rows; ++r) {  // a source position's (phi(q) . k_s) u_s, or a row e of W times phi_e
      const T* __restrict__ row = head + r * width;
      const T c = a.cache ? fw::dot(phi.data(), row, E) : phi[r];
      const T* __restrict__ u = a.cache ? row + E : row;
#pragma GCC ivdep
      for (int64_t m = 0; m < a.M; ++m) acc[m] += c * u[m];
    }
    const T sum = a.z ? acc[D] + z_eps : T(1);  // y = numerator / (z . phi(q) + Z_EPS), as divide_by_z divides
    for (int64_t m = 0; m < D; ++m) out[n * D + m] = acc[m] / sum;
  }
}

template <typename T>
inline __attribute__((always_inline)) void read_range_of(const fw::Heads<const T>& Q, const T* src, T* out,
                                                         const fw::Shape& s, const Source& a, T z_eps, int64_t b,
                                                         int64_t e) {
  fw::with_row<T>(s, [&](auto map) __attribute__((always_inline)) { read_rows(Q, src, out, s, a, map, z_eps, b, e); });
}
FW_CLONES void read_range(const fw::Heads<const float>& Q, const float* src, float* out, const fw::Shape& s,
                          const Source& a, float z_eps, int64_t b, int64_t e) {
  read_range_of(Q, src, out, s, a, z_eps, b, e);
}
FW_CLONES void read_range(const fw::Heads<const double>& Q, const double* src, double* out, const fw::Shape& s,
                          const Source& a, double z_eps, int64_t b, int64_t e) {
  read_range_of(Q, src, out, s, a, z_eps, b, e);
}

}  // namespace

torch::Tensor raw_source_read(const torch::Tensor& q, const torch::Tensor& source, int64_t map, int64_t nu,
                              const c10::optional<torch::Tensor>& projection, int64_t norm, double eps,
                              bool z_column, double z_eps) {
  TORCH_CHECK(q.dim() == 4 && q.size(2) == 1 && q.size(3) >= 1 && q.device().is_cpu() &&
                  (q.scalar_type() == torch::kFloat || q.scalar_type() == torch::kDouble),
              "raw_source_read: q must be [B, H, 1, d], float32 or float64 on the CPU");
  fw::Shape s;
  torch::Tensor kept;
  fw::set_map(s, map, nu, projection, norm, q.size(3), q.scalar_type(), kept, "raw_source_read");
  s.eps = eps;
  const int64_t B = q.size(0), H = q.size(1), E = fw::width(s);
  TORCH_CHECK(source.dim() == 4 && source.size(1) == H && source.size(0) >= 1 && B % source.size(0) == 0 &&
                  source.scalar_type() == q.scalar_type(),
              "raw_source_read: source must be [R, H, S, E + M] or [R, H, E, M] of q's dtype, R dividing B");
  Source a{source.size(0), H, source.size(2), 0, B / source.size(0), source.size(2) < E, z_column};
  a.M = a.cache ? source.size(3) - E : source.size(3);
  TORCH_CHECK(a.M >= (z_column ? 2 : 1) && (a.cache || source.size(2) == E),
              "raw_source_read: source must be [R, H, S, E + M] (S < E) or [R, H, E, M] for phi's E = ", E);
  const int64_t D = z_column ? a.M - 1 : a.M;
  const auto qc = last_contiguous(q), sc = source.contiguous();
  auto o = torch::empty({B, H, 1, D}, q.options());
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "raw_source_read", [&] {
    const auto Q = fw::heads_of<const scalar_t>(qc);
    const scalar_t* src = sc.data_ptr<scalar_t>();
    scalar_t* out = o.data_ptr<scalar_t>();
    at::parallel_for(0, B * H, 4, [&](int64_t b, int64_t e) {
      read_range(Q, src, out, s, a, static_cast<scalar_t>(z_eps), b, e);
    });
  });
  return o;
}
