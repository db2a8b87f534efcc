// Python bindings of fw_fairseq._cpu (kernels.h).
#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dpfp_forward", &dpfp_forward, "DPFP-nu of x [..., d] -> [..., 2 d nu] (float32/float64, CPU), divided by "
        "max(its sum (norm 1) or 2-norm (norm 2), eps)", py::arg("x"), py::arg("nu"), py::arg("norm") = 0,
        py::arg("eps") = 1e-6);
  m.def("dpfp_backward", &dpfp_backward, "the gradient of x from the gradient of dpfp_forward's output (the same "
        "norm and eps)", py::arg("grad"), py::arg("x"), py::arg("nu"), py::arg("norm") = 0, py::arg("eps") = 1e-6);
  m.def("dpfp_scores", &dpfp_scores, "rows [B, H, R, 2 d nu] . dpfp(keys [B, H, t, d]) -> [B, H, R, t] (no grad)");
  m.def("feature_attend_forward", &feature_attend_forward, "from q [B, H, Tq, d], k [B, H, T, d] and a map (0 "
        "DPFP-nu, 1 ELU+1, 2 Hedgehog): kind 0 (A, s), the sum rule's read weights A = mask(phi(q) phi(k)^T) / s, s = "
        "row sums + eps; kind 1 ([P; X], empty), the delta rule's products of normalised features (causal); the "
        "features of keys at key_padding_mask [B, T] read as 0", py::arg("q"), py::arg("k"),
        py::arg("key_padding_mask"), py::arg("map"), py::arg("nu"), py::arg("kind"), py::arg("causal"),
        py::arg("norm"), py::arg("eps"), py::arg("blas") = true);
  m.def("feature_attend_backward", &feature_attend_backward, "(dq, dk) from the gradient of feature_attend_forward's "
        "first result, dq and dk in q's and k's layouts", py::arg("grad"), py::arg("out"), py::arg("sums"),
        py::arg("q"), py::arg("k"), py::arg("key_padding_mask"), py::arg("map"), py::arg("nu"), py::arg("kind"),
        py::arg("causal"), py::arg("norm"), py::arg("eps"), py::arg("blas") = true);
  m.def("feature_attend_blas", &feature_attend_blas, "whether feature_attend's products found BLAS (sgemm_, dgemm_)");
  m.def("lazy_step", &lazy_step, "a decoding step of the lazy cache, of DPFP-nu's raw keys or (nu 0) of features: (o, u)", py::arg("phi_q"),
        py::arg("phi_k"), py::arg("v"), py::arg("beta"), py::arg("keys"), py::arg("writes"), py::arg("decay"),
        py::arg("nu"), py::arg("order") = py::none(), py::arg("keys_out") = py::none(),
        py::arg("writes_out") = py::none(), py::arg("key") = py::none(), py::arg("norm") = 0, py::arg("eps") = 1e-6);
  m.def("state_step", &state_step, "a decoding step of the [B', H, E, M] state, rows `order` of it, into out; returns o",
        py::arg("q"), py::arg("k"), py::arg("v"), py::arg("beta"), py::arg("alpha"), py::arg("state"), py::arg("order"),
        py::arg("out"));
}
