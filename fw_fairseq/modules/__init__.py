"""fairseq-facing modules: projections, heads, masks and incremental state around fw_fairseq.ops."""
from fw_fairseq.modules.fast_weight_attention import FastWeightAttention
from fw_fairseq.modules.fast_weight_config import FastWeightConfig

__all__ = ["FastWeightAttention", "FastWeightConfig"]
