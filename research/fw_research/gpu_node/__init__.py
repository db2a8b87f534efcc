"""The offline GPU node: its kit (`make gpu-kit`, `python -m fw_research.gpu_node.gpu_kit`) and its check
(research/fw_research/gpu_node/gpu_check.sh, which runs `python -m fw_research.gpu_node.gpu_check`)."""
