"""The compiled CUDA extension fw_fairseq._cuda (setup.py builds csrc/cuda/ into it where nvcc and a CUDA torch were
there at install time), loaded once, and the one decision of whether a call runs on it: `cuda_kernel`, which the
rules' dispatch (rules/dispatch.py) and the kernel's custom op (cuda_ops.py) both ask. Beside cpu_extension.py, its
CPU counterpart.
"""
import logging

import torch

logger = logging.getLogger(__name__)

_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_extension = None  # fw_fairseq._cuda once imported, False if it cannot be imported
_fallbacks_logged = set()


def cuda_kernel(q, v, kernel):
    """The single dispatch decision: the compiled extension if it has the kernel named `kernel` (a rule's
    UpdateRule.kernel: its {kernel}_forward) and can run these inputs, else None (chunked path). An
    extension built without a rule's kernel falls back for that rule only: no rule runs another's kernel.
    Falling back on a CUDA tensor is logged once per reason."""
    global _extension
    if not q.is_cuda:
        return None
    if _extension is None:
        try:
            from fw_fairseq import _cuda

            _extension = _cuda if hasattr(_cuda, "MAX_E") else False
            if not _extension:  # an extension older than the exported limits: its kernels are unknown here
                _log_fallback("the CUDA extension fw_fairseq._cuda is out of date (no MAX_E); rebuild it")
        except (ImportError, OSError) as err:
            _extension = False
            _log_fallback(f"the CUDA extension fw_fairseq._cuda is not available ({err})")
    E, M = q.shape[-1], v.shape[-1]
    if _extension is False:
        reason = "the CUDA extension fw_fairseq._cuda is not available"
    elif not hasattr(_extension, f"{kernel}_forward"):
        reason = f"the CUDA extension fw_fairseq._cuda has no {kernel} kernel"
    elif q.dtype not in _KERNEL_DTYPES:
        reason = f"dtype {q.dtype} is not one of the kernel's fp16/bf16/fp32"
    elif not (1 <= E <= _extension.MAX_E and 1 <= M <= _extension.MAX_M):
        reason = (f"E={E}, M={M} are outside the kernel's 1 <= E <= {_extension.MAX_E}, "
                  f"1 <= M <= {_extension.MAX_M}")
    else:
        return _extension
    _log_fallback(reason)
    return None


def _log_fallback(reason):
    if reason not in _fallbacks_logged:
        _fallbacks_logged.add(reason)
        logger.warning("fast weights on CUDA use the chunked PyTorch path: %s", reason)
