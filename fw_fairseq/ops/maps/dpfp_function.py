"""DPFP-nu with a hand-written backward: the same function as feature_maps.dpfp, in fewer passes.

dpfp(x, nu) as written (r = [relu(x), relu(-x)]; phi = concat_i r * roll(r, i)) makes autograd keep
and walk a rolled copy per i, two concatenations and their backward copies: on a CPU the map's
forward and backward over [..., 2 d nu] took as long as the rest of a DPFP-2 attention layer. Here:

    forward:  r_ext = [r[2d-nu:], r]  ([..., 2d + nu], so that roll(r, i) is the view r_ext[nu-i : nu-i+2d]);
              phi_i = r * roll(r, i), each written straight into its slice of the output.
    backward: phi_i[j] = r[j] r[j-i], so dr[j] = sum_i dphi_i[j] r[j-i] + dphi_i[j+i] r[j+i] (indices mod 2d).
              The second sum is accumulated into a buffer laid out like r_ext (position j at nu + j,
              the wrapped j < 0 at the front) and the front is folded back onto the tail;
              dx = dr[:d] [x > 0] - dr[d:] [x < 0] (relu's gradient at 0 is 0, as autograd's).

Only r_ext is saved ([..., 2d + nu], never phi; normalised, also y and the norms). First order only
(guards.first_order), like the fast weight ops. While torch.compile traces, feature_maps.Dpfp calls the
plain dpfp instead, which inductor fuses by itself; when autograd records nothing, dpfp_forward alone
(an autograd.Function's call costs about 5 us, a fifth of a decoding step's map).

On the CPU, float32 and float64 run the compiled csrc/cpu/dpfp.cpp (fw_fairseq._cpu) where it was built:
the same sums, a row at a time, in one pass over the input and the output each way, and only x is
saved. Where it was not built (no compiler at install time), the PyTorch form above runs.
"""
import torch

from fw_fairseq.ops.kernels.cpu_extension import KERNEL_NORMS, cpu_kernel
from fw_fairseq.ops.common.guards import first_order
from fw_fairseq.ops.maps.normalize_function import PHI_EPS, normalize_backward, normalize_saving, plain_normalize

def dpfp_forward(x, nu, norm=None, eps=PHI_EPS):
    """DPFP-nu of x [..., d] without autograd -> phi [..., 2 d nu]: the eager form when nothing is
    recorded (generation, validation). norm "sum" or "l2": phi / max(its norm, eps) (normalize_function's
    maths), which the CPU kernel does in the same pass instead of three more over the output."""
    kernel = cpu_kernel(x)
    if kernel:
        return kernel.dpfp_forward(x, nu, KERNEL_NORMS[norm], eps)
    phi = _torch_forward(x, nu)[0]
    return phi if norm is None else plain_normalize(phi, norm, eps)


def dpfp_scores(rows, keys, nu):
    """rows [B, H, R, 2 d nu] . DPFP-nu(keys [B, H, t, d]) -> [B, H, R, t] without autograd: on the CPU
    kernel, phi of each key formed in registers and never stored; elsewhere through dpfp_forward."""
    kernel = cpu_kernel(keys)
    if kernel and rows.dtype == keys.dtype:
        return kernel.dpfp_scores(rows, keys, nu)
    return rows @ dpfp_forward(keys, nu).transpose(-1, -2)


def _torch_forward(x, nu):
    """The PyTorch form: (phi [..., 2 d nu], r_ext [..., 2d + nu]). As fast as the plain maths on a
    decoding step's few rows and several times faster on a training batch."""
    d = x.shape[-1]
    lead = x.shape[:-1]
    r_ext = x.new_empty(*lead, 2 * d + nu)  # [..., 2d + nu]: r's last nu entries, then r
    torch.clamp_min(x, 0, out=r_ext[..., nu:nu + d])
    torch.clamp_max(x, 0, out=r_ext[..., nu + d:]).neg_()
    r_ext[..., :nu] = r_ext[..., 2 * d:]
    r = r_ext[..., nu:]  # [..., 2d]
    phi = x.new_empty(*lead, nu, 2 * d)  # [..., nu, 2d] = [..., E] once flattened
    for i in range(1, nu + 1):
        torch.mul(r, r_ext[..., nu - i:nu - i + 2 * d], out=phi[..., i - 1, :])
    return phi.view(*lead, 2 * d * nu), r_ext


class DpfpFunction(torch.autograd.Function):
    """phi [..., 2 d nu] = DPFP-nu of x [..., d], or with norm ("sum" or "l2", --fw-delta-norm) phi / max(its
    norm, eps): normalize_function's maths, which the CPU kernel does in the same pass as the map each way
    (apart, the normalisation's backward walked the E-wide tensors three more times and took as long as a
    DPFP-2 delta layer's rule). nu is checked by the caller."""

    @staticmethod
    def forward(ctx, x, nu, norm=None, eps=PHI_EPS):
        ctx.nu, ctx.norm, ctx.eps, ctx.kernel = nu, norm, eps, cpu_kernel(x)
        if ctx.kernel:
            ctx.save_for_backward(x)
            return ctx.kernel.dpfp_forward(x, nu, KERNEL_NORMS[norm], eps)
        phi, r_ext = _torch_forward(x, nu)
        if norm is None:
            ctx.save_for_backward(r_ext)
            return phi
        y, saved = normalize_saving(phi, norm, eps)
        ctx.save_for_backward(r_ext, *saved)
        return y

    @staticmethod
    @first_order
    def backward(ctx, grad):
        nu = ctx.nu
        if ctx.kernel:
            (x,) = ctx.saved_tensors
            return ctx.kernel.dpfp_backward(grad, x, nu, KERNEL_NORMS[ctx.norm], ctx.eps), None, None, None
        r_ext, *saved = ctx.saved_tensors
        if ctx.norm is not None:
            grad = normalize_backward(grad, saved, ctx.norm)
        return _torch_backward(grad, r_ext, nu), None, None, None


def _torch_backward(grad, r_ext, nu):
    """The PyTorch form's dx [..., d] from dphi [..., 2 d nu] and r_ext (module docstring)."""
    d = (r_ext.shape[-1] - nu) // 2
    lead = r_ext.shape[:-1]
    g = grad.reshape(*lead, nu, 2 * d)  # [..., nu, 2d]: dphi_i
    r = r_ext[..., nu:]
    dr_ext = grad.new_empty(*lead, 2 * d + nu)  # position j of dr at nu + j; j in [-nu, 0) in front
    dr = dr_ext[..., nu:]  # [..., 2d]
    torch.mul(g[..., 0, :], r_ext[..., nu - 1:nu - 1 + 2 * d], out=dr)  # dphi_1[j] r[j-1]
    dr_ext[..., :nu].zero_()
    for i in range(2, nu + 1):
        dr.addcmul_(g[..., i - 1, :], r_ext[..., nu - i:nu - i + 2 * d])  # dphi_i[j] r[j-i]
    for i in range(1, nu + 1):
        dr_ext[..., nu - i:nu - i + 2 * d].addcmul_(g[..., i - 1, :], r)  # dphi_i[m] r[m] to m - i
    dr[..., 2 * d - nu:] += dr_ext[..., :nu]  # the wrapped positions -nu..-1 are 2d-nu..2d-1
    # relu(x)' and relu(-x)' from the signs of r's halves (0 or 1): torch.where is far slower on a CPU
    dx = dr[..., :d] * r[..., :d].sign()
    dx.addcmul_(dr[..., d:], r[..., d:].sign(), value=-1)
    return dx
