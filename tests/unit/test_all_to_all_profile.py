"""The optional ``intra_node.all_to_all`` collective: bus factor, profile YAML (read,
validated, written back, merged, shown), calibration plan and fit, and the import of
nccl-tests ``alltoall_perf`` logs.

Oracles: nccl-tests ``doc/PERFORMANCE.md`` (alltoall busbw = algbw * (n-1)/n) and the known
alpha/busbw of the synthetic fixture ``tests/fixtures/nccl_tests/alltoall_perf_h200_synthetic.log``
(25 us, 340 GB/s over 8 ranks).
"""

from __future__ import annotations

import copy
import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest

from plansim.calibrate.build import build_update
from plansim.calibrate.importer import update_from_nccl_tests
from plansim.calibrate.nccl_tests import parse_nccl_tests, read_nccl_tests_log
from plansim.calibrate.plan import build_plan
from plansim.calibrate.raw import frame
from plansim.calibrate.run_info import RunInfo
from plansim.cli import main
from plansim.errors import InputFileError, SpecError
from plansim.io.profiles import (
    ProfileUpdate,
    load_profile,
    merge_profile,
    profile_from_dict,
    profile_to_dict,
    profile_to_yaml,
    profiles_dir,
    write_profile,
)
from plansim.specs.curves import (
    COLLECTIVES,
    KNOWN_COLLECTIVES,
    OPTIONAL_COLLECTIVES,
    CollectiveCurve,
    Curve,
    bus_factor,
)
from tests.unit.test_calibrate_profile import ALPHA_S, BUSBW, MESSAGES, synthetic_rows

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_tests"
A2A_LOG = FIXTURES / "alltoall_perf_h200_synthetic.log"
BASE = "h200-sxm-141gb"
#: what the YAML section of the tests holds (edge units)
SECTION = {
    "latency_us": 20,
    "message_bytes": [1048576, 16777216, 268435456],
    "busbw_gb_per_s": [100, 250, 320],
}
SOURCE = "measured: test all_to_all"


def _with_all_to_all(**changes: Any) -> dict[str, Any]:
    """A shipped profile's YAML dict with an ``intra_node.all_to_all`` section added."""
    data = profile_to_dict(load_profile(BASE))
    section = {**copy.deepcopy(SECTION), **changes}
    data["intra_node"]["all_to_all"] = section
    data["provenance"]["intra_node.all_to_all"] = SOURCE
    data["provenance"]["intra_node.all_to_all.latency_us"] = SOURCE + " (alpha)"
    return data


def _a2a_curve(latency_s: float = 20e-6) -> CollectiveCurve:
    return CollectiveCurve(
        collective="all_to_all",
        latency_s=latency_s,
        busbw_bytes_per_s=Curve(x=(1e6, 1e8), y=(1e11, 3e11)),
    )


# --------------------------------------------------------------------------- curves
def test_vocabulary_keeps_the_four_required_and_adds_all_to_all_as_optional() -> None:
    assert COLLECTIVES == ("all_reduce", "all_gather", "reduce_scatter", "sendrecv")
    assert OPTIONAL_COLLECTIVES == ("all_to_all",)
    assert KNOWN_COLLECTIVES == COLLECTIVES + OPTIONAL_COLLECTIVES


@pytest.mark.parametrize("n", [2, 4, 8, 72])
def test_all_to_all_bus_factor_is_n_minus_1_over_n(n: int) -> None:
    # nccl-tests doc/PERFORMANCE.md: alltoall busbw = algbw * (n-1)/n
    assert bus_factor("all_to_all", n) == pytest.approx((n - 1) / n)
    assert bus_factor("all_to_all", 1) == 0.0
    with pytest.raises(SpecError, match=r"collective='alltoall' is not allowed.*all_to_all"):
        bus_factor("alltoall", n)


def test_all_to_all_curve_prices_the_whole_send_buffer() -> None:
    curve = _a2a_curve()
    # 8 ranks, 64 MiB per-rank buffer: 7/8 of it leaves the rank at the busbw of that size
    size = 64 * 2**20
    busbw = curve.busbw_bytes_per_s(size)
    assert 1e11 < busbw < 3e11
    assert curve.time_s(size, 8) == pytest.approx(20e-6 + size * 7 / 8 / busbw)
    assert curve.time_s(size, 1) == 0.0  # a group of one sends nothing
    with pytest.raises(SpecError, match=r"all_to_all\.latency_s must be >= 0"):
        _a2a_curve(latency_s=-1e-6)
    with pytest.raises(SpecError, match="collective='alltoall' is not allowed"):
        dataclasses.replace(curve, collective="alltoall")


# --------------------------------------------------------------------------- profile YAML
def test_profiles_without_all_to_all_load_and_write_back_unchanged(tmp_path: Path) -> None:
    for name in ("h100-sxm5-80gb", "cpu-2core-gloo"):
        profile = load_profile(name)
        assert list(profile.intra_node) == list(COLLECTIVES)
        assert profile.intra_node.get("all_to_all") is None
        data = profile_to_dict(profile)
        assert "all_to_all" not in data["intra_node"]
        assert not any("all_to_all" in key for key in data["provenance"])
        out = tmp_path / f"{name}.yaml"
        write_profile(profile, out)
        text = profile_to_yaml(profile)
        assert out.read_text(encoding="utf-8") == text and "all_to_all" not in text


def test_all_to_all_section_is_read_in_si_units_and_round_trips(tmp_path: Path) -> None:
    data = _with_all_to_all()
    profile = profile_from_dict(data, source="a2a.yaml")
    curve = profile.intra_node["all_to_all"]
    assert curve.collective == "all_to_all" and curve.source == SOURCE
    assert curve.latency_s == pytest.approx(20e-6)
    assert curve.busbw_bytes_per_s.x == (1048576.0, 16777216.0, 268435456.0)
    assert curve.busbw_bytes_per_s.y == pytest.approx((100e9, 250e9, 320e9))
    assert list(profile.intra_node) == list(KNOWN_COLLECTIVES)  # required ones first
    assert profile_to_dict(profile) == data
    out = tmp_path / "a2a.yaml"
    write_profile(profile, out)
    again = load_profile(str(out))
    assert again == profile
    text = out.read_text(encoding="utf-8")
    assert text.index("  sendrecv:") < text.index("  all_to_all:") < text.index("nic_gb_per_s")


def test_all_to_all_is_written_after_the_required_ones_whatever_the_dict_order() -> None:
    profile = load_profile(BASE)
    first = {"all_to_all": _a2a_curve(), **profile.intra_node}
    reordered = dataclasses.replace(
        profile,
        intra_node=first,
        provenance={
            **profile.provenance,
            "intra_node.all_to_all": SOURCE,
            "intra_node.all_to_all.latency_us": SOURCE,
        },
    )
    assert list(profile_to_dict(reordered)["intra_node"]) == list(KNOWN_COLLECTIVES)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"latency_us": "abc"}, r"intra_node\.all_to_all\.latency_us: expected a number"),
        (
            {"busbw_gb_per_s": [100, "x", 320]},
            r"intra_node\.all_to_all\.busbw_gb_per_s: expected a list of numbers, element 1",
        ),
        (
            {"busbw_gb_per_s": [100, 250]},
            r"intra_node\.all_to_all: the two lists have different lengths \(3 and 2\)",
        ),
        ({"busbw_gb_per_s": [100, -250, 320]}, r"intra_node\.all_to_all: curve\.y\[1\]"),
        (
            {"message_bytes": [1048576, 1048576, 268435456]},
            r"intra_node\.all_to_all: curve\.x must be strictly increasing",
        ),
        (
            {"latency_us": -5},
            r"intra_node\.all_to_all\.latency_us: -5 is outside the plausible range",
        ),
        ({"bandwidth": 1}, r"intra_node\.all_to_all: unknown key\(s\) 'bandwidth'"),
    ],
)
def test_bad_all_to_all_values_name_the_field(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(InputFileError, match=rf"^a2a\.yaml: {message}"):
        profile_from_dict(_with_all_to_all(**changes), source="a2a.yaml")


def test_all_to_all_keys_and_provenance_are_checked() -> None:
    data = _with_all_to_all()
    del data["intra_node"]["all_to_all"]["busbw_gb_per_s"]
    with pytest.raises(
        InputFileError, match=r"intra_node\.all_to_all\.busbw_gb_per_s: missing required key"
    ):
        profile_from_dict(data, source="a2a.yaml")
    data = _with_all_to_all()
    del data["provenance"]["intra_node.all_to_all.latency_us"]
    with pytest.raises(InputFileError, match=r"no source given for: intra_node\.all_to_all\.lat"):
        profile_from_dict(data, source="a2a.yaml")
    data = _with_all_to_all()
    del data["intra_node"]["all_to_all"]
    with pytest.raises(InputFileError, match=r"keys the file does not have: intra_node\.all_to"):
        profile_from_dict(data, source="a2a.yaml")
    data = profile_to_dict(load_profile(BASE))
    data["intra_node"]["alltoall"] = copy.deepcopy(SECTION)
    with pytest.raises(InputFileError, match=r"intra_node: unknown key\(s\) 'alltoall'"):
        profile_from_dict(data, source="a2a.yaml")
    data = profile_to_dict(load_profile(BASE))
    del data["intra_node"]["sendrecv"]  # a required one is still required
    with pytest.raises(InputFileError, match=r"intra_node\.sendrecv: missing required key"):
        profile_from_dict(data, source="a2a.yaml")


def test_hardware_profile_rejects_an_unknown_collective_key() -> None:
    profile = load_profile(BASE)
    odd = {**profile.intra_node, "broadcast": profile.intra_node["all_reduce"]}
    with pytest.raises(SpecError, match=r"intra_node has unknown collectives: broadcast"):
        dataclasses.replace(profile, intra_node=odd)


# --------------------------------------------------------------------------- merging
def test_merge_adds_all_to_all_and_keeps_every_other_entry() -> None:
    base = load_profile(BASE)
    update = ProfileUpdate(
        intra_node={"all_to_all": _a2a_curve()},
        provenance={
            "intra_node.all_to_all": SOURCE,
            "intra_node.all_to_all.latency_us": SOURCE,
        },
    )
    merged = merge_profile(base, update)
    assert merged.intra_node["all_to_all"] == _a2a_curve()
    assert {k: merged.intra_node[k] for k in COLLECTIVES} == dict(base.intra_node)
    assert dict(merged.provenance) == {**base.provenance, **update.provenance}
    data = profile_to_dict(merged)
    assert data["intra_node"]["all_to_all"] == {
        "latency_us": 20,
        "message_bytes": [1000000, 100000000],
        "busbw_gb_per_s": [100, 300],
    }
    assert profile_to_dict(profile_from_dict(data, source="m")) == data
    # merged again (a newer measurement) it is replaced, not duplicated
    newer = merge_profile(
        merged, dataclasses.replace(update, intra_node={"all_to_all": _a2a_curve(30e-6)})
    )
    assert newer.intra_node["all_to_all"].latency_s == pytest.approx(30e-6)
    with pytest.raises(InputFileError, match=r"no source for: intra_node\.all_to_all"):
        merge_profile(base, ProfileUpdate(intra_node={"all_to_all": _a2a_curve()}))


def test_a_new_profile_needs_the_four_required_collectives_not_all_to_all() -> None:
    base = load_profile(BASE)
    three = {c: base.intra_node[c] for c in ("all_reduce", "all_gather", "reduce_scatter")}
    update = ProfileUpdate(
        name="x",
        gpus_per_node=8,
        peak_flops_per_s={"bf16": 1e15},
        intra_node={**three, "all_to_all": _a2a_curve()},
        scalars={f: getattr(base, f) for f in ("kernel_launch_s", "hbm_capacity_bytes")},
    )
    update = dataclasses.replace(update, provenance=dict.fromkeys(update.replaced_keys(), SOURCE))
    with pytest.raises(InputFileError, match=r"cannot create.*intra_node\.sendrecv"):
        merge_profile(None, update)


# --------------------------------------------------------------------------- profiles show
def test_profiles_show_prints_all_to_all_only_when_present(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "a2a.yaml"
    write_profile(profile_from_dict(_with_all_to_all(), source="a2a"), path)
    assert main(["profiles", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert f"intra_node.all_to_all: {SOURCE}" in text
    assert f"latency_us 20: {SOURCE} (alpha)" in text
    block = text[text.index("intra_node.all_to_all:") :]
    # 8 ranks, 256 MiB: 20 us + 2^28 * 7/8 / 320 GB/s = 754.0 us
    assert re.search(r"268435456\s+320\s+754\.0", block)
    assert main(["profiles", "show", BASE]) == 0
    assert "all_to_all" not in capsys.readouterr().out


# --------------------------------------------------------------------------- calibration
@pytest.mark.parametrize("quick", [True, False])
def test_calibrate_plan_measures_all_to_all_like_the_other_collectives(quick: bool) -> None:
    plan = build_plan(nproc=4, device="cpu", quick=quick)
    comm = [i for i in plan.items if i.kind == "collective"]
    assert {i.op for i in comm} == set(KNOWN_COLLECTIVES)

    def sizes(op: str) -> list[tuple[int, int, int]]:
        return [(i.sweep, i.group_size, i.shape[0]) for i in comm if i.op == op]

    assert sizes("all_to_all") == sizes("all_reduce")
    for item in comm:
        if item.op == "all_to_all":
            assert item.shape[0] % (4 * item.group_size) == 0  # whole fp32 elements per peer
            assert item.work == item.shape[0] and item.work_unit == "byte"
    # quick: 3 passes x the world group (4) x 9 sizes; full: 5 passes x groups 2, 4 x 22 sizes
    assert len(sizes("all_to_all")) == (3 * 1 * 9 if quick else 5 * 2 * 22)
    one_rank = build_plan(nproc=1, device="cpu", quick=quick)
    assert not [i for i in one_rank.items if i.kind == "collective"]


def _info() -> RunInfo:
    return RunInfo(
        run_id="20250101T000000.000Z",
        date="2025-01-01",
        backend="gloo",
        device="cpu",
        nproc=2,
        quick=True,
        raw_file="cpu-test.raw.csv",
        env={"torch": "2.13.0+cpu", "device_name": "Test CPU", "cpu_count": "2"},
        host_memory_total_bytes=16 * 2**30,
        host_memory_available_bytes=12 * 2**30,
        load_average=(0.1, 2.0),
    )


def test_calibrated_rows_fit_into_an_all_to_all_curve() -> None:
    rows = synthetic_rows(collectives=KNOWN_COLLECTIVES)  # all_to_all factor 1/2 at 2 ranks
    table = frame(rows, run_id="20250101T000000.000Z")
    built = build_update(table, _info(), base=None, name="cpu-test")
    profile = merge_profile(None, built.update)
    curve = profile.intra_node["all_to_all"]
    for size in MESSAGES[-3:]:
        expected = (ALPHA_S + size * 0.5 / BUSBW) * 1.01  # slowest rank is 1% slower
        assert curve.time_s(size, 2) == pytest.approx(expected, rel=1e-6)
    assert profile.provenance["intra_node.all_to_all"].startswith("measured: ")
    assert "gloo all_to_all" in profile.provenance["intra_node.all_to_all"]
    assert "intra_node.all_to_all.latency_us" in profile.provenance
    assert any(label.startswith("all_to_all (2 ranks)") for label, _ in built.summary)
    # a run without all_to_all rows (every raw CSV before it) builds no curve
    old = build_update(frame(synthetic_rows(), run_id="r"), _info(), base=None, name="cpu-test")
    assert "all_to_all" not in old.update.intra_node


def test_all_to_all_call_runs_on_gloo(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    dist = pytest.importorskip("torch.distributed")
    from plansim.calibrate.bench_collective import collective_call
    from plansim.calibrate.plan import Item

    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    item = Item(
        kind="collective", op="all_to_all", dtype="fp32", shape=(64,), work=64.0, work_unit="byte"
    )
    calls: list[tuple[Any, ...]] = []
    real = dist.all_to_all_single

    def spy(output: Any, source: Any, **kw: Any) -> Any:
        calls.append((output.numel(), source.numel(), kw.get("group")))
        return real(output, source, **kw)

    monkeypatch.setattr(dist, "all_to_all_single", spy)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        collective_call(item, group=None, rank=0, device=torch.device("cpu"))()
    finally:
        dist.destroy_process_group()
    assert calls == [(16, 16, None)]  # the whole 64-byte buffer in, the whole one out


# --------------------------------------------------------------------------- nccl-tests import
def test_alltoall_log_imports_into_intra_node_all_to_all() -> None:
    log = read_nccl_tests_log(A2A_LOG)
    base = load_profile(BASE)
    imported = update_from_nccl_tests([log], tier="intra-node", base=base, date="2026-01-01")
    assert set(imported.update.intra_node) == {"all_to_all"}
    curve = imported.update.intra_node["all_to_all"]
    assert curve.latency_s == pytest.approx(25e-6, rel=0.01)
    assert curve.busbw_bytes_per_s.y[-1] == pytest.approx(340e9, rel=0.01)
    # the profile gives back the log's time: 1 GiB over 8 ranks took 2782.73 us (in-place)
    merged = merge_profile(base, imported.update)
    assert merged.intra_node["all_to_all"].time_s(2**30, 8) == pytest.approx(2782.73e-6, rel=1e-6)
    source = merged.provenance["intra_node.all_to_all"]
    assert source.startswith("nccl-tests: alltoall_perf_h200_synthetic.log")
    assert "alltoall_perf, 8 ranks on 1 node(s)" in source
    assert {k: merged.intra_node[k] for k in COLLECTIVES} == dict(base.intra_node)


def _two_nodes(text: str) -> str:
    """The fixture's run as if ranks 4-7 were on a second host."""
    return re.sub(r"(Rank  [4-7] .* on )hgx-h200-07", r"\1hgx-h200-08", text)


def test_alltoall_across_nodes_is_noted_not_used_for_the_nic() -> None:
    text = _two_nodes(A2A_LOG.read_text(encoding="utf-8"))
    a2a = parse_nccl_tests(text, source="alltoall_perf_2nodes.log")
    assert a2a.runs[0].num_nodes == 2
    base = load_profile(BASE)
    with pytest.raises(
        InputFileError,
        match=r"needs a run over at least 2 nodes.*none found of all_reduce.*all_to_all runs",
    ):
        update_from_nccl_tests([a2a], tier="inter-node", base=base, date="d")
    with pytest.raises(InputFileError, match="spans 2 nodes; import it with --tier inter-node"):
        update_from_nccl_tests([a2a], tier="intra-node", base=base, date="d")
    reduce = read_nccl_tests_log(FIXTURES / "all_reduce_perf_n02_h100_2nodes.log")
    # an H100 log into the H200 profile: forced (the runs' GPU check is not under test here)
    imported = update_from_nccl_tests(
        [a2a, reduce], tier="inter-node", base=base, date="d", force=True
    )
    assert any(n.startswith("all_to_all: a run across nodes, not used") for n in imported.notes)
    assert not imported.update.intra_node


def test_import_command_adds_all_to_all_to_a_profile_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / f"{BASE}.yaml"
    target.write_bytes((profiles_dir() / f"{BASE}.yaml").read_bytes())
    assert main(["profiles", "import-nccl-tests", "--into", str(target), str(A2A_LOG)]) == 0
    assert "intra_node.all_to_all <- alltoall_perf_h200_synthetic.log" in capsys.readouterr().out
    profile = load_profile(str(target))
    assert profile.intra_node["all_to_all"].busbw_bytes_per_s.y[-1] == pytest.approx(
        340e9, rel=0.01
    )
    assert {k: profile.intra_node[k] for k in COLLECTIVES} == dict(load_profile(BASE).intra_node)
