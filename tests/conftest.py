"""The suite's one process-wide setting: without a GPU, Triton kernels (the fused read, fw_fairseq/ops/fused_read/)
run under Triton's interpreter on CPU tensors, so their parity tests run here as they do compiled on a GPU. It must
be set before Triton decorates a kernel, i.e. before fw_fairseq.ops.fused_read's kernels are first imported."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
