"""Inter-node ring bandwidth falls with the node count (N16: NVIDIA/nccl issue #1229, H100
reduce_scatter busbw 360, 345, 320, 300, 280, 260 GB/s on 4 ... 128 nodes): the profile's
``inter_node_ring_scaling`` and its use by the collective model."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from plansim.analytic.comm import collective_time_s
from plansim.analytic.ranks import GroupSpan
from plansim.errors import InputFileError
from plansim.io.profiles import (
    ProfileUpdate,
    load_profile,
    merge_profile,
    profiles_dir,
    write_profile,
)
from plansim.specs.hardware import Curve, HardwareProfile

#: N16 rows C0172-C0177: (nodes, reduce_scatter busbw GB/s).
N16 = ((4, 360), (8, 345), (16, 320), (32, 300), (64, 280), (128, 260))
BIG = 2.0**40  # 1 TiB: every latency is below 0.1% of the time


def _span(num_nodes: int) -> GroupSpan:
    return GroupSpan(size=8 * num_nodes, members_per_node=8, num_nodes=num_nodes)


def _flat(profile: HardwareProfile) -> HardwareProfile:
    return dataclasses.replace(profile, inter_node_ring_fraction=None)


def _time(profile: HardwareProfile, collective: str, num_nodes: int) -> float:
    return collective_time_s(
        profile, collective=collective, message_bytes=BIG, span=_span(num_nodes)
    )


@pytest.mark.parametrize(("nodes", "busbw"), N16)
def test_a_long_ring_loses_bandwidth_as_n16_measured(nodes: int, busbw: float) -> None:
    h100 = load_profile("h100-sxm5-80gb")
    for collective in ("reduce_scatter", "all_gather"):
        slower = _time(h100, collective, nodes) / _time(_flat(h100), collective, nodes)
        assert slower == pytest.approx(360 / busbw, rel=2e-3)


def test_no_loss_within_four_nodes_or_for_all_reduce_and_none_extrapolated() -> None:
    h100 = load_profile("h100-sxm5-80gb")
    for nodes in (2, 3, 4):
        assert _time(h100, "all_gather", nodes) == _time(_flat(h100), "all_gather", nodes)
    for nodes in (2, 64, 512):  # NCCL's tree all-reduce holds its rate (N15, N11)
        assert _time(h100, "all_reduce", nodes) == _time(_flat(h100), "all_reduce", nodes)
    # beyond the last measured count the fraction stays at 128 nodes' 260 / 360
    assert h100.ring_busbw_fraction(1024) == h100.ring_busbw_fraction(128)
    assert h100.ring_busbw_fraction(128) == pytest.approx(260 / 360, rel=1e-3)
    assert h100.ring_busbw_fraction(1) == 1.0


def test_every_gpu_profile_has_it_and_the_one_node_cpu_profile_not() -> None:
    for path in sorted(profiles_dir().glob("*.yaml")):
        profile = load_profile(str(path))
        has = profile.inter_node_ring_fraction is not None
        assert has is (profile.name != "cpu-2core-gloo"), profile.name
        if has:
            assert "N16" in profile.provenance["inter_node_ring_scaling"]


def test_it_round_trips_and_survives_a_merge(tmp_path: Path) -> None:
    a100 = load_profile("a100-sxm4-80gb")
    out = tmp_path / "copy.yaml"
    write_profile(a100, out)
    again = load_profile(str(out))
    assert again.inter_node_ring_fraction == a100.inter_node_ring_fraction
    assert again.provenance["inter_node_ring_scaling"] == a100.provenance["inter_node_ring_scaling"]
    update = ProfileUpdate(
        scalars={"nic_latency_s": 5e-6}, provenance={"nic_latency_us": "measured: test"}
    )
    merged = merge_profile(a100, update)
    assert merged.inter_node_ring_fraction == a100.inter_node_ring_fraction


def _raw() -> dict[str, Any]:
    text = (profiles_dir() / "h100-sxm5-80gb.yaml").read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    assert isinstance(data, dict)
    return copy.deepcopy(data)


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (
            lambda d: d["inter_node_ring_scaling"]["busbw_fraction"].__setitem__(0, 1.2),
            r"inter_node_ring_scaling\.busbw_fraction: values must be in \(0, 1\]",
        ),
        (
            lambda d: d["inter_node_ring_scaling"]["num_nodes"].reverse(),
            r"inter_node_ring_scaling: curve\.x must be strictly increasing",
        ),
        (
            lambda d: d["inter_node_ring_scaling"].pop("num_nodes"),
            r"inter_node_ring_scaling\.num_nodes: missing required key",
        ),
        (
            lambda d: d["provenance"].pop("inter_node_ring_scaling"),
            "provenance: no source given for: inter_node_ring_scaling",
        ),
    ],
)
def test_a_bad_section_is_one_clear_error(tmp_path: Path, edit: Any, pattern: str) -> None:
    data = _raw()
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(InputFileError, match=rf"^{path}: .*{pattern}"):
        load_profile(str(path))


def test_the_spec_refuses_a_fraction_above_one() -> None:
    h100 = load_profile("h100-sxm5-80gb")
    with pytest.raises(ValueError, match=r"inter_node_ring_fraction values must be in \(0, 1\]"):
        dataclasses.replace(h100, inter_node_ring_fraction=Curve(x=(4.0, 8.0), y=(1.0, 1.1)))
