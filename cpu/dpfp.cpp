// DPFP-nu on the CPU, forward and backward, one pass over each row (fw_fairseq/ops/dpfp_function.py).
//
// r = [relu(x), relu(-x)] (w = 2d wide); phi_i[j] = r[j] r[(j - i) mod w], i = 1..nu, phi = [phi_1 .. phi_nu].
// Backward: dr[j] = sum_i g_i[j] r[j - i] + g_i[j + i] r[j + i] (indices mod w);
//           dx[k] = dr[k] if x[k] > 0, -dr[k + d] if x[k] < 0, else 0 (relu's gradient at 0, as autograd's).
// The PyTorch form of the same maths walks [rows, w nu] tensors several times; here a row's r and dr
// live in a w-long buffer, and each modular shift is split into two plain ranges the compiler vectorises.
// Inputs: x [..., d] (any layout: made contiguous), float32 or float64; grad [..., w nu].
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

namespace {

constexpr int64_t kGrain = 64;  // rows per parallel task

// The row loops are compiled twice, for AVX2 and for the baseline x86-64 (or the target's default),
// and the loader picks by the CPU (GCC/Clang function multiversioning): AVX2 ran the backward 2.6x
// faster than SSE2 on the 2-core CPU, and a build may run on another machine than the one it was made on.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FW_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define FW_CLONES
#endif

template <typename T>
inline __attribute__((always_inline)) void relu_pair(const T* __restrict__ x, T* __restrict__ r, int64_t d) {
  for (int64_t k = 0; k < d; ++k) {
    const T v = x[k];
    r[k] = v > T(0) ? v : T(0);
    r[k + d] = v < T(0) ? -v : T(0);
  }
}

// phi of rows [begin, end): X [rows, d] -> P [rows, w nu]
template <typename T>
inline __attribute__((always_inline)) void forward_rows(const T* X, T* P, int64_t d, int64_t nu, int64_t begin,
                                                        int64_t end) {
  const int64_t w = 2 * d;
  std::vector<T> buffer(w);
  const T* __restrict__ r = buffer.data();
  for (int64_t n = begin; n < end; ++n) {
    relu_pair(X + n * d, buffer.data(), d);
    T* __restrict__ p = P + n * w * nu;
    for (int64_t i = 1; i <= nu; ++i, p += w) {
      for (int64_t j = 0; j < i; ++j) p[j] = r[j] * r[j - i + w];
      for (int64_t j = i; j < w; ++j) p[j] = r[j] * r[j - i];
    }
  }
}

// dx of rows [begin, end) from G [rows, w nu] and X [rows, d]
template <typename T>
inline __attribute__((always_inline)) void backward_rows(const T* G, const T* X, T* DX, int64_t d, int64_t nu,
                                                         int64_t begin, int64_t end) {
  const int64_t w = 2 * d;
  std::vector<T> r_buffer(w), dr_buffer(w);
  const T* __restrict__ r = r_buffer.data();
  T* __restrict__ dr = dr_buffer.data();
  for (int64_t n = begin; n < end; ++n) {
    const T* xn = X + n * d;
    relu_pair(xn, r_buffer.data(), d);
    std::fill(dr_buffer.begin(), dr_buffer.end(), T(0));
    const T* __restrict__ g = G + n * w * nu;
    for (int64_t i = 1; i <= nu; ++i, g += w) {
      for (int64_t j = 0; j < i; ++j) dr[j] += g[j] * r[j - i + w];
      for (int64_t j = i; j < w; ++j) dr[j] += g[j] * r[j - i];
      for (int64_t j = 0; j < w - i; ++j) dr[j] += g[j + i] * r[j + i];
      for (int64_t j = w - i; j < w; ++j) dr[j] += g[j + i - w] * r[j + i - w];
    }
    T* dxn = DX + n * d;
    for (int64_t k = 0; k < d; ++k) {
      const T v = xn[k];
      dxn[k] = v > T(0) ? dr[k] : (v < T(0) ? -dr[k + d] : T(0));
    }
  }
}

// One clone set per dtype, overloaded so that AT_DISPATCH's scalar_t picks it.
FW_CLONES void forward_range(const float* X, float* P, int64_t d, int64_t nu, int64_t b, int64_t e) {
  forward_rows(X, P, d, nu, b, e);
}
FW_CLONES void forward_range(const double* X, double* P, int64_t d, int64_t nu, int64_t b, int64_t e) {
  forward_rows(X, P, d, nu, b, e);
}
FW_CLONES void backward_range(const float* G, const float* X, float* DX, int64_t d, int64_t nu, int64_t b,
                              int64_t e) {
  backward_rows(G, X, DX, d, nu, b, e);
}
FW_CLONES void backward_range(const double* G, const double* X, double* DX, int64_t d, int64_t nu, int64_t b,
                              int64_t e) {
  backward_rows(G, X, DX, d, nu, b, e);
}

void check(const torch::Tensor& x, int64_t nu, const char* fn) {
  TORCH_CHECK(x.device().is_cpu(), fn, ": x must be a CPU tensor");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kDouble, fn,
              ": x must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) >= 1, fn, ": x must be [..., d] with d >= 1");
  TORCH_CHECK(nu >= 1 && nu <= 2 * x.size(-1) - 1, fn, ": nu must be in 1..2d-1, got ", nu);
}

torch::Tensor dpfp_forward(const torch::Tensor& x, int64_t nu) {
  check(x, nu, "dpfp_forward");
  const auto xc = x.contiguous();
  const int64_t d = xc.size(-1), rows = xc.numel() / d;
  auto sizes = xc.sizes().vec();
  sizes.back() = 2 * d * nu;
  auto phi = torch::empty(sizes, xc.options());  // [..., 2 d nu]
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "dpfp_forward", [&] {
    const scalar_t* X = xc.data_ptr<scalar_t>();
    scalar_t* P = phi.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kGrain, [&](int64_t b, int64_t e) { forward_range(X, P, d, nu, b, e); });
  });
  return phi;
}

torch::Tensor dpfp_backward(const torch::Tensor& grad, const torch::Tensor& x, int64_t nu) {
  check(x, nu, "dpfp_backward");
  const auto xc = x.contiguous();
  const int64_t d = xc.size(-1), rows = xc.numel() / d;
  TORCH_CHECK(grad.numel() == rows * 2 * d * nu && grad.size(-1) == 2 * d * nu,
              "dpfp_backward: grad must be [..., 2 d nu]");
  const auto gc = grad.to(xc.scalar_type()).contiguous();
  auto dx = torch::empty_like(xc);  // [..., d]
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "dpfp_backward", [&] {
    const scalar_t* X = xc.data_ptr<scalar_t>();
    const scalar_t* G = gc.data_ptr<scalar_t>();
    scalar_t* DX = dx.data_ptr<scalar_t>();
    at::parallel_for(0, rows, kGrain, [&](int64_t b, int64_t e) { backward_range(G, X, DX, d, nu, b, e); });
  });
  return dx;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("dpfp_forward", &dpfp_forward, "DPFP-nu of x [..., d] -> [..., 2 d nu] (float32/float64, CPU)");
  m.def("dpfp_backward", &dpfp_backward, "the gradient of x from the gradient of dpfp_forward's output");
}
