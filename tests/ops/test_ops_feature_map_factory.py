"""The feature-map factory (ops.feature_map) and the FeatureMap interface: every map is built from the
flags' values, called the same way, knows its width, checks its own arguments with the messages of the
functions it wraps, and only FAVOR+ draws anything on redraw()."""
import pytest
import torch

from fw_fairseq.ops import FEATURE_MAPS, FavorPlus, FeatureMap, dpfp, elu_plus_one, feature_map

ARGS = {"elu": {}, "dpfp": {"nu": 3}, "favor": {"m": 16}, "hedgehog": {}, "t2r": {"heads": 3, "t2r_features": 5}}


@pytest.mark.parametrize("name", FEATURE_MAPS)
@pytest.mark.parametrize("d_key", [2, 8])  # nu = 3 needs 2 * d_key - 1 >= 3
def test_every_map_is_called_the_same_way(name, d_key):
    phi = feature_map(name, d_key, **ARGS[name])
    assert isinstance(phi, FeatureMap)
    x = torch.randn(2, 3, 5, d_key, dtype=torch.float64)
    for is_query in (False, True):
        out = phi(x, is_query)
        assert out.shape == (2, 3, 5, phi.out_dim) and (out >= 0).all()
    expected_width = {"elu": d_key, "dpfp": 2 * d_key * 3, "favor": 2 * 16, "hedgehog": 2 * d_key, "t2r": 5}[name]
    assert phi.out_dim == expected_width


def test_maps_compute_the_functions_they_wrap():
    x = torch.randn(4, 6, dtype=torch.float64)
    torch.testing.assert_close(feature_map("elu", 6)(x, True), elu_plus_one(x), rtol=0, atol=0)
    torch.testing.assert_close(feature_map("dpfp", 6, nu=2)(x, False), dpfp(x, 2), rtol=0, atol=0)
    hedgehog = torch.cat([torch.softmax(x, -1), torch.softmax(-x, -1)], dim=-1)
    torch.testing.assert_close(feature_map("hedgehog", 6)(x, False), hedgehog, rtol=0, atol=0)
    favor = feature_map("favor", 6, m=8)
    assert isinstance(favor, FavorPlus) and favor.projection.shape == (8, 6)


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_redraw_changes_only_favor(name):
    torch.manual_seed(0)
    phi = feature_map(name, 4, **ARGS[name])
    x = torch.randn(2, 3, 5, 4)  # [B, H, T, d]: T2R's weights are per head (3)
    before = phi(x, False)
    phi.redraw()
    assert torch.equal(phi(x, False), before) == (name != "favor")


@pytest.mark.parametrize("name,kwargs,match", [
    ("relu", {}, r"name='relu' is not allowed; allowed: \('elu', 'dpfp', 'favor', 'hedgehog', 't2r'\)"),
    ("dpfp", {"nu": 8}, r"dpfp: nu=8 is not allowed; nu must be an int in 1\.\.7"),
    ("dpfp", {}, r"dpfp: nu=None is not allowed"),
    ("favor", {"m": 0}, "FavorPlus: num_features=0"),
    ("favor", {}, "FavorPlus: num_features=None"),
    ("elu", {"d_key": 0}, "EluPlusOne: d_key=0"),
    ("dpfp", {"d_key": 2.0, "nu": 1}, "Dpfp: d_key=2.0"),
])
def test_factory_checks_arguments_when_building(name, kwargs, match):
    kwargs = {"d_key": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        feature_map(name, **kwargs)


def test_parameter_free_maps_add_nothing_to_a_state_dict():
    assert not feature_map("elu", 4).state_dict() and not feature_map("dpfp", 4, nu=1).state_dict()
    assert not feature_map("hedgehog", 4).state_dict()
    assert list(feature_map("favor", 4, m=2).state_dict()) == ["projection"]
