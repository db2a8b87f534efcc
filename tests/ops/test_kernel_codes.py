"""The codes of phi's maps and normalisations, one table each on the Python side (cpu_extension.KERNEL_MAPS,
KERNEL_NORMS), are the C++ kernels' enums (csrc/cpu/map_rows.h fw::Map, csrc/cpu/dpfp_rows.h fw::Norm), which are
written by hand, so a code changed on one side alone fails here rather than running another map; the Triton kernels'
constants (fused_read/phi_tiles.py) are made from KERNEL_MAPS."""
import re
from pathlib import Path

import pytest

from fw_fairseq.ops.kernels.cpu_extension import KERNEL_MAPS, KERNEL_NORMS

CPU = Path(__file__).resolve().parents[2] / "csrc" / "cpu"


def enum(header, name):
    """{member: value} of `enum name : int64_t { kA = 0, ... }` in csrc/cpu/header."""
    body = re.search(rf"enum {name} : int64_t {{([^}}]*)}}", (CPU / header).read_text()).group(1)
    return {member: int(value) for member, value in re.findall(r"k(\w+) = (\d+)", body)}


def test_maps_match_the_cpu_kernels_enum():
    assert enum("map_rows.h", "Map") == {"Dpfp": 0, "Elu": 1, "Hedgehog": 2, "Favor": 3}
    assert {name.capitalize(): code for name, code in KERNEL_MAPS.items()} == enum("map_rows.h", "Map")


def test_norms_match_the_cpu_kernels_enum():
    codes = {("None" if name is None else name.capitalize() if name == "sum" else name.upper()): code
             for name, code in KERNEL_NORMS.items()}
    assert codes == enum("dpfp_rows.h", "Norm")


def test_maps_match_the_triton_kernels_constants():
    phi_tiles = pytest.importorskip("fw_fairseq.ops.fused_read.phi_tiles")
    assert {name: getattr(phi_tiles, name.upper()).value for name in KERNEL_MAPS} == KERNEL_MAPS
