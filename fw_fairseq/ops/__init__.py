"""Pure tensor maths of fast weight programmers: update rules and feature maps (no fairseq here)."""
from fw_fairseq.ops.rules.dispatch import fast_weight_read
from fw_fairseq.ops.maps.factory import FEATURE_MAPS, feature_map
from fw_fairseq.ops.maps.feature_maps import FavorPlus, FeatureMap, dpfp, elu_plus_one
from fw_fairseq.ops.maps.normalize_function import PHI_NORMS, l2_normalize, phi_scale, sum_normalize
from fw_fairseq.ops.rules.public import (fast_weight_attend, fast_weight_delta, fast_weight_gated_delta, fast_weight_sum,
                                        fast_weight_write)
from fw_fairseq.ops.rules.record import MissingForm, UpdateRule
from fw_fairseq.ops.rules.registry import RULES, register_rule
from fw_fairseq.ops.common.z_column import append_z_column, divide_by_z

__all__ = [
    "fast_weight_sum",
    "fast_weight_delta",
    "fast_weight_gated_delta",
    "fast_weight_write",
    "fast_weight_read",
    "fast_weight_attend",
    "RULES",
    "UpdateRule",
    "register_rule",
    "MissingForm",
    "append_z_column",
    "divide_by_z",
    "FEATURE_MAPS",
    "FeatureMap",
    "feature_map",
    "elu_plus_one",
    "dpfp",
    "FavorPlus",
    "sum_normalize",
    "l2_normalize",
    "PHI_NORMS",
    "phi_scale",
]
