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
from plansim.cli import main
from plansim.errors import InputFileError
from plansim.io.profiles import (
    ProfileUpdate,
    load_profile,
    merge_profile,
    profiles_dir,
    write_profile,
)
from plansim.specs.curves import Curve
from plansim.specs.hardware import HardwareProfile

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


def _with_message_section(data: dict[str, Any], **changes: Any) -> None:
    """Give ``data`` an ``inter_node_message_scaling`` section (the same loader reads it),
    with ``changes`` applied; ``provenance=None`` leaves its source out."""
    section: dict[str, Any] = {"message_bytes": [1024, 2048], "busbw_fraction": [0.5, 1.0]}
    section.update({k: v for k, v in changes.items() if k != "provenance"})
    data["inter_node_message_scaling"] = {k: v for k, v in section.items() if v is not None}
    if changes.get("provenance", "test") is not None:
        data["provenance"]["inter_node_message_scaling"] = "test"


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
        (
            lambda d: _with_message_section(d, busbw_fraction=[0.5, 1.5]),
            r"inter_node_message_scaling\.busbw_fraction: values must be in \(0, 1\]",
        ),
        (
            lambda d: _with_message_section(d, message_bytes=[2048, 1024]),
            r"inter_node_message_scaling: curve\.x must be strictly increasing",
        ),
        (
            lambda d: _with_message_section(d, message_bytes=None),
            r"inter_node_message_scaling\.message_bytes: missing required key",
        ),
        (
            lambda d: _with_message_section(d, provenance=None),
            "provenance: no source given for: inter_node_message_scaling",
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


def _log(path: Path, *, nodes: int, busbw_gb_per_s: float, alpha_us: float = 40.0) -> Path:
    """A synthetic ``reduce_scatter_perf`` log over ``nodes`` nodes x 8 ranks in nccl-tests'
    format: time = alpha + size * (n - 1) / n / busbw."""
    ranks = 8 * nodes
    lines = [
        "# nccl-tests version 2.17.6 nccl-headers=22501 nccl-library=22501",
        "# Collective test starting: reduce_scatter_perf",
        "#",
        "# Using devices",
    ]
    lines += [
        f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on node{r // 8:03d} device {r % 8:2d} "
        f"[0000:18:00] NVIDIA H100 80GB HBM3"
        for r in range(ranks)
    ]
    lines += [
        "#",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong"
        "     time   algbw   busbw #wrong",
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)        "
        "     (us)  (GB/s)  (GB/s)       ",
    ]
    for k in range(23, 34):  # 8 MiB .. 8 GiB
        size = 2**k
        t_us = alpha_us + size * (ranks - 1) / ranks / (busbw_gb_per_s * 1e3)
        algbw = size / t_us / 1e3
        busbw = algbw * (ranks - 1) / ranks
        row = f"{t_us:8.1f} {algbw:7.2f} {busbw:7.2f}      0"
        lines.append(f"{size:12d} {size // 4 // ranks:13d}     float     sum      -1 {row} {row}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_import_nccl_tests_derives_the_curve_from_runs_at_several_node_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "h100.yaml"
    target.write_text(
        (profiles_dir() / "h100-sxm5-80gb.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    logs = [
        _log(tmp_path / f"rs_{n}.log", nodes=n, busbw_gb_per_s=b)
        for n, b in ((4, 350.0), (16, 315.0), (64, 280.0))
    ]
    args = ["profiles", "import-nccl-tests", *map(str, logs), "--into", str(target)]
    assert main([*args, "--tier", "inter-node"]) == 0
    assert "inter_node_ring_scaling <- nccl-tests reduce_scatter" in capsys.readouterr().out
    ring = load_profile(str(target)).inter_node_ring_fraction
    assert ring is not None
    assert ring.x == (4.0, 16.0, 64.0)
    assert ring.y == pytest.approx((1.0, 315 / 350, 280 / 350), rel=2e-3)
    # one node count is not a fall-off: the profile keeps the one it had
    again = tmp_path / "again.yaml"
    again.write_text(target.read_text(encoding="utf-8"), encoding="utf-8")
    assert main([*args[:2], str(logs[0]), "--into", str(again), "--tier", "inter-node"]) == 0
    assert load_profile(str(again)).inter_node_ring_fraction == ring
