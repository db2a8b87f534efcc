"""The feature-map factory: the one place a --fw-feature-map name becomes its FeatureMap."""
from fw_fairseq.ops.maps.feature_maps import Dpfp, EluPlusOne, FavorPlus, Hedgehog
from fw_fairseq.ops.maps.learned import T2r, TrainableHedgehog

FEATURE_MAPS = ("elu", "dpfp", "favor", "hedgehog", "t2r")


def feature_map(name, d_key, nu=None, m=None, fixed=False, heads=1, t2r_features=None, trainable=False):
    """The FeatureMap `name` (one of FEATURE_MAPS) for d_key-wide heads: nu is DPFP's, m and fixed FAVOR+'s
    number of random features (E = 2m) and redraw policy, t2r_features T2R's K (E = K), trainable Hedgehog's
    per-head linear layer; heads is the learned maps' number of heads (their parameters are per head). Each is
    checked by its map, ignored by the others."""
    if name == "elu":
        return EluPlusOne(d_key)
    if name == "dpfp":
        return Dpfp(d_key, nu)
    if name == "favor":
        return FavorPlus(d_key, m, fixed)
    if name == "hedgehog":
        return TrainableHedgehog(d_key, heads) if trainable else Hedgehog(d_key)
    if name == "t2r":
        return T2r(d_key, heads, t2r_features)
    raise ValueError(f"feature_map: name={name!r} is not allowed; allowed: {FEATURE_MAPS}")
