// Python bindings of fw_fairseq._cpu (kernels.h).
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dpfp_forward", &dpfp_forward, "DPFP-nu of x [..., d] -> [..., 2 d nu] (float32/float64, CPU), divided by "
        "max(its sum (norm 1) or 2-norm (norm 2), eps)", py::arg("x"), py::arg("nu"), py::arg("norm") = 0,
        py::arg("eps") = 1e-6);
  m.def("dpfp_backward", &dpfp_backward, "the gradient of x from the gradient of dpfp_forward's output (the same "
        "norm and eps)", py::arg("grad"), py::arg("x"), py::arg("nu"), py::arg("norm") = 0, py::arg("eps") = 1e-6);
  m.def("dpfp_scores", &dpfp_scores, "rows [B, H, R, 2 d nu] . dpfp(keys [B, H, t, d]) -> [B, H, R, t] (no grad)");
  m.def("feature_attend_forward", &feature_attend_forward, "(A, s) from q [B, H, Tq, d], k [B, H, T, d] and a map (0 "
        "DPFP-nu, 1 ELU+1, 2 Hedgehog, 3 FAVOR+ with its projection [m, d]): the sum rule's read weights "
        "A = mask(phi(q) phi(k)^T) / s, s = row sums + eps; the features of keys at key_padding_mask [B, T] read as 0",
        py::arg("q"), py::arg("k"), py::arg("key_padding_mask"), py::arg("map"), py::arg("nu"), py::arg("projection"),
        py::arg("causal"), py::arg("eps"), py::arg("blas") = true);
  m.def("feature_attend_backward", &feature_attend_backward, "(dq, dk) from the gradient of feature_attend_forward's "
        "A, dq and dk in q's and k's layouts", py::arg("grad"), py::arg("out"), py::arg("sums"), py::arg("q"),
        py::arg("k"), py::arg("key_padding_mask"), py::arg("map"), py::arg("nu"), py::arg("projection"),
        py::arg("causal"), py::arg("eps"), py::arg("blas") = true);
  m.def("feature_attend_blas", &feature_attend_blas, "whether the short reads' products found BLAS (sgemm_, dgemm_)");
  m.def("delta_attend_forward", &delta_attend_forward, "(O, U): the delta rule's read of a short sequence (causal: "
        "one chunk) from q [B, H, Tq, d], k [B, H, T, d], v [B, H, T, M], beta [B, H, T], phi of a map (as "
        "feature_attend_forward's) normalised by norm (1 sum, 2 l2), and its writes U", py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("beta"), py::arg("map"), py::arg("nu"), py::arg("projection"), py::arg("causal"),
        py::arg("norm"), py::arg("eps"), py::arg("blas") = true);
  m.def("delta_attend_backward", &delta_attend_backward, "(dq, dk, dv, dbeta) from the gradient of "
        "delta_attend_forward's O and its U", py::arg("grad"), py::arg("writes"), py::arg("q"), py::arg("k"),
        py::arg("v"), py::arg("beta"), py::arg("map"), py::arg("nu"), py::arg("projection"), py::arg("causal"),
        py::arg("norm"), py::arg("eps"), py::arg("blas") = true);
  m.def("lazy_step", &lazy_step, "a decoding step of the lazy cache, of DPFP-nu's raw keys or (nu 0) of features: (o, u)", py::arg("phi_q"),
        py::arg("phi_k"), py::arg("v"), py::arg("beta"), py::arg("keys"), py::arg("writes"), py::arg("decay"),
        py::arg("nu"), py::arg("order") = py::none(), py::arg("keys_out") = py::none(),
        py::arg("writes_out") = py::none(), py::arg("key") = py::none(), py::arg("norm") = 0, py::arg("eps") = 1e-6);
  m.def("raw_lazy_step", &raw_lazy_step, "lazy_step from the raw rows q, k [B, H, 1, d] of a map (feature_attend_"
        "forward's codes), phi normalised by norm, with the sum rule's z column (z_column), appending in the caches' "
        "storages (traced with order or lineage: a reorder copies no row): (o [B, H, 1, D], or None where the "
        "storages have no room; the next lineage or None; keys and writes of t + 1 positions)",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("keys"), py::arg("writes"),
        py::arg("decay"), py::arg("map"), py::arg("nu"), py::arg("projection"), py::arg("order"),
        py::arg("lineage"), py::arg("norm"), py::arg("eps"), py::arg("z_column"), py::arg("z_eps"));
  m.def("raw_source_read", &raw_source_read, "a cross-attention read of a cached source (the keys' phi and writes "
        "[R, H, S, E + M], or the memory [R, H, E, M]) from the raw query rows q [B, H, 1, d]: o [B, H, 1, D]",
        py::arg("q"), py::arg("source"), py::arg("map"), py::arg("nu"), py::arg("projection"), py::arg("norm"),
        py::arg("eps"), py::arg("z_column"), py::arg("z_eps"));
  m.def("state_step", &state_step, "a decoding step of the [B', H, E, M] state, rows `order` of it, into out; returns o",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("alpha"), py::arg("state"), py::arg("order"),
        py::arg("out"));
}
