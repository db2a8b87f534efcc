"""Pure tensor maths of fast weight programmers: update rules and feature maps (no fairseq here)."""
from .fast_weight import fast_weight_read
from .feature_maps import FEATURE_MAPS, FavorPlus, FeatureMap, dpfp, elu_plus_one, feature_map
from .normalize_function import PHI_NORMS, l2_normalize, phi_scale, sum_normalize
from .rules import (RULES, UpdateRule, fast_weight_attend, fast_weight_delta, fast_weight_gated_delta, fast_weight_sum,
                    fast_weight_write)
from .z_column import append_z_column, divide_by_z

__all__ = [
    "fast_weight_sum",
    "fast_weight_delta",
    "fast_weight_gated_delta",
    "fast_weight_write",
    "fast_weight_read",
    "fast_weight_attend",
    "RULES",
    "UpdateRule",
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
