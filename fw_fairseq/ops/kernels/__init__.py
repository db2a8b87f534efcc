"""The compiled kernels' glue: the CPU extension (fw_fairseq._cpu) and the CUDA extension (fw_fairseq._cuda), loaded
once each; the CUDA kernels' autograd Function and custom op; the CPU kernels' short reads from raw heads."""
