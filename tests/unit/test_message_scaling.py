"""A collective across nodes at a given message size: the profile's optional
``inter_node_message_scaling`` (fraction of the NIC line rate by message size), imported from a
multi-node nccl-tests run, and its use by the collective model.

Oracle: the 2-node H100 all_reduce run of N02 (rows C0033-C0063, the fixture
``all_reduce_perf_n02_h100_2nodes.log``): imported, the model must give back the run's own
time at every size whose bandwidth term the fit keeps.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plansim.analytic.comm import collective_time_s
from plansim.analytic.ranks import GroupSpan
from plansim.calibrate.nccl_tests import read_nccl_tests_log
from plansim.cli import main
from plansim.io.profiles import load_profile, profiles_dir, write_profile
from plansim.specs.curves import Curve
from plansim.specs.hardware import HardwareProfile

FIXTURE = Path(__file__).parent.parent / "fixtures" / "nccl_tests"
LOG = FIXTURE / "all_reduce_perf_n02_h100_2nodes.log"
TWO_NODES = GroupSpan(size=16, members_per_node=8, num_nodes=2)


def _imported(tmp_path: Path) -> HardwareProfile:
    target = tmp_path / "h100.yaml"
    target.write_text(
        (profiles_dir() / "h100-sxm5-80gb.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    args = ["profiles", "import-nccl-tests", str(LOG), "--into", str(target)]
    assert main([*args, "--tier", "inter-node"]) == 0
    return load_profile(str(target))


def _measured() -> list[tuple[float, float]]:
    """(size, fastest of out-of-place / in-place seconds) for each row of the fixture."""
    run = read_nccl_tests_log(str(LOG)).runs[0]
    rows = []
    for row in run.rows:
        times = [t.time_s for t in (row.out_of_place, row.in_place) if t is not None]
        rows.append((float(row.size_bytes), min(times)))
    return rows


def test_an_imported_run_is_reproduced_at_every_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = _imported(tmp_path)
    assert "inter_node_message_scaling <- all_reduce_perf_n02_h100_2nodes.log" in (
        capsys.readouterr().out
    )
    curve = profile.inter_node_message_fraction
    assert curve is not None and max(curve.y) == 1.0 and curve.y[-1] == 1.0
    checked = 0
    for size, seconds in _measured():
        if size < curve.x[0]:  # below the fit's first size: alpha alone, as before
            continue
        model = collective_time_s(
            profile, collective="all_reduce", message_bytes=size, span=TWO_NODES
        )
        assert model == pytest.approx(seconds, rel=1e-6), size
        checked += 1
    assert checked >= 15
    # without the section, the NVLink curve's shape: C0053 (16 MiB) measured 951.6 us
    flat = dataclasses.replace(profile, inter_node_message_fraction=None)
    nvlink_shaped = collective_time_s(
        flat, collective="all_reduce", message_bytes=2.0**24, span=TWO_NODES
    )
    assert nvlink_shaped < 300e-6
    assert collective_time_s(
        profile, collective="all_reduce", message_bytes=2.0**24, span=TWO_NODES
    ) == pytest.approx(951.6e-6, rel=1e-6)
    assert "alpha 122.3 us removed" in profile.provenance["inter_node_message_scaling"]


def test_it_changes_nothing_inside_a_node_or_without_the_section() -> None:
    h100 = load_profile("h100-sxm5-80gb")
    assert h100.inter_node_message_fraction is None
    assert h100.message_busbw_fraction(2.0**20) == 1.0
    half = dataclasses.replace(
        h100, inter_node_message_fraction=Curve(x=(1.0, 2.0**40), y=(0.5, 0.5), source="test")
    )
    one_node = GroupSpan(size=8, members_per_node=8, num_nodes=1)
    for size in (2.0**16, 2.0**26, 2.0**34):
        for collective in ("all_reduce", "all_gather", "reduce_scatter"):
            inside = collective_time_s(
                h100, collective=collective, message_bytes=size, span=one_node
            )
            assert inside == collective_time_s(
                half, collective=collective, message_bytes=size, span=one_node
            )
    # across nodes at a size where the NIC is the bottleneck, half the line rate doubles
    # the bandwidth term
    one_per_node = GroupSpan(size=4, members_per_node=1, num_nodes=4)
    alpha = collective_time_s(h100, collective="all_reduce", message_bytes=1.0, span=one_per_node)
    full = collective_time_s(
        h100, collective="all_reduce", message_bytes=2.0**34, span=one_per_node
    )
    slow = collective_time_s(
        half, collective="all_reduce", message_bytes=2.0**34, span=one_per_node
    )
    assert slow - alpha == pytest.approx(2 * (full - alpha), rel=1e-3)


def test_it_round_trips_and_shows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profile = _imported(tmp_path)
    out = tmp_path / "copy.yaml"
    write_profile(profile, out)
    capsys.readouterr()
    assert main(["profiles", "show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "inter_node_message_scaling: nccl-tests: all_reduce_perf_n02_h100_2nodes.log" in shown
    assert " message_bytes busbw_fraction" in shown
    again = load_profile(str(out))
    assert again.inter_node_message_fraction == profile.inter_node_message_fraction
    assert (
        again.provenance["inter_node_message_scaling"]
        == profile.provenance["inter_node_message_scaling"]
    )


def test_the_spec_refuses_a_fraction_above_one() -> None:
    h100 = load_profile("h100-sxm5-80gb")
    with pytest.raises(ValueError, match=r"inter_node_message_fraction values must be in"):
        dataclasses.replace(h100, inter_node_message_fraction=Curve(x=(1.0, 2.0), y=(1.0, 1.2)))
