// The CPU extension fw_fairseq._cpu (setup.py builds csrc/cpu/*.cpp into it; bindings in extension.cpp).
#pragma once

#include <torch/extension.h>

// The row loops are compiled twice, for x86-64-v3 (AVX2 and FMA) and for the baseline x86-64 (or the
// target's default), and the loader picks by the CPU (GCC/Clang function multiversioning): AVX2 ran the
// backward 2.6x faster than SSE2 on the 2-core CPU, and a build may run on another machine than the one
// it was made on. An AVX-512 clone (x86-64-v4) scored the decoding cache 2% faster there: not worth a third.
// With vexp.h's exp on 64-byte vectors it took FAVOR+'s training read ~20% faster forward (its update 1.20-1.22x
// softmax -> 1.18x, before favor_row.h's paired exp made the exp a smaller part of it), but the same 64-byte
// vectors in the x86-64-v3 clone ran that read 2.3x slower: a vector width per clone needs a dispatch of its own,
// not target_clones.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FW_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define FW_CLONES
#endif

// x itself if its last dim is contiguous, else a contiguous copy: a cache's view of its first t positions
// keeps its layout (copying it would cost what the cache saves)
inline torch::Tensor last_contiguous(const torch::Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

// beam search's order [B] (int64) checked against the `rows` rows it picks from -> its contiguous copy
inline torch::Tensor checked_order(const torch::Tensor& order, int64_t B, int64_t rows, const char* fn) {
  TORCH_CHECK(order.scalar_type() == torch::kLong && order.numel() == B, fn, ": order must be B int64 rows");
  const auto oc = order.contiguous();
  for (int64_t b = 0; b < B; ++b) {
    const int64_t row = oc.data_ptr<int64_t>()[b];
    TORCH_CHECK(row >= 0 && row < rows, fn, ": order[", b, "] = ", row, " is not one of the ", rows, " rows");
  }
  return oc;
}

// dpfp.cpp: DPFP-nu's forward and backward (normalised if asked: norm 0 none, 1 sum, 2 l2), and
// rows . phi(raw keys) for the decoding cache
torch::Tensor dpfp_forward(const torch::Tensor& x, int64_t nu, int64_t norm, double eps);
torch::Tensor dpfp_backward(const torch::Tensor& grad, const torch::Tensor& x, int64_t nu, int64_t norm, double eps);
torch::Tensor dpfp_scores(const torch::Tensor& rows, const torch::Tensor& keys, int64_t nu);

// feature_attend.cpp: the sum rule's read weights A [B, H, Tq, T] = mask(phi(q) phi(k)^T) / s and the row sums
// s [B, H, Tq] from raw heads q [B, H, Tq, d], k [B, H, T, d] and the map's code (0 DPFP-nu, 1 ELU+1, 2 Hedgehog,
// 3 FAVOR+ with its projection [m, d]; the features of keys at key_padding_mask [B, T] read as 0); and (dq, dk)
// from the gradient of A. blas: the products through BLAS where it was found (feature_attend_blas), else loops
std::tuple<torch::Tensor, torch::Tensor> feature_attend_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                 const c10::optional<torch::Tensor>& key_padding_mask,
                                                                 int64_t map, int64_t nu,
                                                                 const c10::optional<torch::Tensor>& projection,
                                                                 bool causal, double eps, bool blas);
std::tuple<torch::Tensor, torch::Tensor> feature_attend_backward(const torch::Tensor& grad, const torch::Tensor& out,
                                                                  const torch::Tensor& sums, const torch::Tensor& q,
                                                                  const torch::Tensor& k,
                                                                  const c10::optional<torch::Tensor>& key_padding_mask,
                                                                  int64_t map, int64_t nu,
                                                                  const c10::optional<torch::Tensor>& projection,
                                                                  bool causal, double eps, bool blas);
bool feature_attend_blas();

// delta_attend.cpp: the delta rule's read O [B, H, Tq, M] of a short sequence (causal: one chunk; else every query
// after the last write) and its writes U [B, H, T, M] from raw heads q [B, H, Tq, d], k [B, H, T, d], values v
// [B, H, T, M] and beta [B, H, T], phi (the map's code as above) normalised by norm; and (dq, dk, dv, dbeta) from
// the gradient of O
std::tuple<torch::Tensor, torch::Tensor> delta_attend_forward(const torch::Tensor& q, const torch::Tensor& k,
                                                               const torch::Tensor& v, const torch::Tensor& beta,
                                                               int64_t map, int64_t nu,
                                                               const c10::optional<torch::Tensor>& projection,
                                                               bool causal, int64_t norm, double eps, bool blas);
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor> delta_attend_backward(
    const torch::Tensor& grad, const torch::Tensor& writes, const torch::Tensor& q, const torch::Tensor& k,
    const torch::Tensor& v, const torch::Tensor& beta, int64_t map, int64_t nu,
    const c10::optional<torch::Tensor>& projection, bool causal, int64_t norm, double eps, bool blas);

// lazy_step.cpp: a decoding step of the lazy cache (DPFP-nu's raw keys, or nu 0: the features themselves) ->
// (o, u), appending the key where given
std::tuple<torch::Tensor, torch::Tensor> lazy_step(const torch::Tensor& phi_q, const torch::Tensor& phi_k,
                                                        const torch::Tensor& v, const c10::optional<torch::Tensor>& beta,
                                                        const torch::Tensor& keys, const torch::Tensor& writes,
                                                        const c10::optional<torch::Tensor>& decay, int64_t nu,
                                                        const c10::optional<torch::Tensor>& order,
                                                        const c10::optional<torch::Tensor>& keys_out,
                                                        const c10::optional<torch::Tensor>& writes_out,
                                                        const c10::optional<torch::Tensor>& key, int64_t norm,
                                                        double eps);

// raw_step.cpp: the same step from the raw rows q, k [B, H, 1, d] of a map (feature_attend_forward's codes), phi
// normalised by norm, the sum rule's z column (z_column) added to v and divided out of the read, appended in the
// caches' own storages (traced with order or lineage: a reorder copies no row) -> (o [B, H, 1, D], undefined where the
// storages have no room; the next lineage or None; the caches' views of t + 1 positions)
std::tuple<torch::Tensor, c10::optional<torch::Tensor>, torch::Tensor, torch::Tensor> raw_lazy_step(
    const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, const c10::optional<torch::Tensor>& beta,
    const torch::Tensor& keys, const torch::Tensor& writes, const c10::optional<torch::Tensor>& decay, int64_t map,
    int64_t nu, const c10::optional<torch::Tensor>& projection, const c10::optional<torch::Tensor>& order,
    const c10::optional<torch::Tensor>& lineage, int64_t norm, double eps, bool z_column, double z_eps);

// source_read.cpp: generation's cross-attention read of a cached source ([R, H, S, E + M] keys' phi and writes, or the
// [R, H, E, M] memory; hypothesis b reads row b / (B / R)) from the raw query rows q [B, H, 1, d] of a map, phi(q)
// normalised by norm, divided by the z column (z_column) -> o [B, H, 1, D]
torch::Tensor raw_source_read(const torch::Tensor& q, const torch::Tensor& source, int64_t map, int64_t nu,
                              const c10::optional<torch::Tensor>& projection, int64_t norm, double eps,
                              bool z_column, double z_eps);

// state_step.cpp: a decoding step of the fast weight state, beam search's reorder folded in
torch::Tensor state_step(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                         const c10::optional<torch::Tensor>& beta, const c10::optional<torch::Tensor>& alpha,
                         const torch::Tensor& state, const c10::optional<torch::Tensor>& order, torch::Tensor out);
