"""Hardware profiles: shipped data, the YAML reader/writer and ``plansim profiles``.

Oracles are numbers from ../shared/reference (hardware.csv rows HW.., comm.csv rows C....),
copied here with their ids so the tests run without that folder.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import yaml

from plansim.cli import main
from plansim.errors import InputFileError, UnknownNameError
from plansim.io import profiles as io_profiles
from plansim.io.profiles import (
    list_profiles,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    profiles_dir,
    write_profile,
)
from plansim.specs.curves import COLLECTIVES
from plansim.specs.hardware import HardwareProfile
from plansim.units import bytes_to_gib

SHIPPED = (
    "a100-sxm4-40gb",
    "a100-sxm4-80gb",
    "b200-sxm-180gb",
    "dgx-b300",
    "gb200-nvl72",
    "gb300-nvl72",
    "h100-sxm5-80gb",
    "h200-sxm-141gb",
    "h800-sxm5-80gb",
    "mi300x-192gb",
)
#: Profiles measured by ``plansim calibrate`` on a machine of CI's kind (raw CSV beside them).
MEASURED = ("cpu-2core-gloo",)
#: One GPU's measurements merged into a copy of its datasheet profile (raw CSV beside it).
MERGED = ("h100-sxm5-80gb-1gpu",)
EVERY = tuple(sorted(SHIPPED + MEASURED + MERGED))

#: Measured MAMF (max achievable matmul TFLOP/s), hardware.csv / H04; H200 bf16 = H100's.
#: fp4: measured on a B200 only (HP13, 5.50 PFLOP/s); GB200 and GB300 take its fraction of peak.
MAMF_TFLOPS = {
    "a100-sxm4-40gb": {"bf16": 271.2},
    "a100-sxm4-80gb": {"bf16": 271.2},
    "h100-sxm5-80gb": {"bf16": 794.5, "fp8": 1402.6},
    "h200-sxm-141gb": {"bf16": 794.5, "fp8": 1453.4},
    "b200-sxm-180gb": {"bf16": 1745.0, "fp8": 3432.5, "fp4": 5500.0},
    "gb200-nvl72": {"bf16": 1822.0, "fp8": 3615.6, "fp4": 5500.0 / 9000 * 10000},
    "h800-sxm5-80gb": {"bf16": 794.5, "fp8": 1402.6},
    "dgx-b300": {"bf16": 1769.0, "fp8": 3353.3, "fp4": 5500.0 / 9000 * 12600},
    # GB200's: no GB300 MAMF (HP12 note 24); fp4 15000 peak (HP12)
    "gb300-nvl72": {"bf16": 1822.0, "fp8": 3615.6, "fp4": 5500.0 / 9000 * 15000},
    "mi300x-192gb": {"bf16": 668.4, "fp8": 668.4 / 1307.4 * 2610},  # fp8: bf16's fraction
}

#: N01 (8x H100, nccl-tests all_reduce_perf, float32): size, oop time us, oop busbw, ip time us,
#: ip busbw (comm.csv rows C0013, C0024, C0028).
N01_ROWS = (
    (32768, 19.33, 2.97, 18.68, 3.07),
    (67108864, 324.7, 361.67, 324.7, 361.68),
    (1073741824, 4029.4, 466.33, 4016.4, 467.85),
)


def _raw(name: str) -> dict[str, Any]:
    data = yaml.safe_load((profiles_dir() / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _write_yaml(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- shipped data
def test_list_profiles_is_the_datasheet_and_the_measured_files() -> None:
    assert list_profiles() == list(EVERY)


@pytest.mark.parametrize("name", MEASURED)
def test_measured_profile_has_its_raw_measurements(name: str) -> None:
    """Every number of a calibrated profile is measured, and the raw CSV it names is beside it
    with the run the provenance cites."""
    profile = load_profile(name)
    assert set(profile.intra_node) == set(COLLECTIVES)
    assert {"fp32", "bf16"} <= set(profile.dtypes())
    assert all(text.startswith("measured: ") for text in profile.provenance.values())
    raw = io_profiles.profiles_dir() / f"{name}.raw.csv"
    runs = set(pd.read_csv(raw)["run_id"])
    cited = {t.split(" run ")[1].split(";")[0] for t in profile.provenance.values()}
    assert cited <= runs and cited


@pytest.mark.parametrize("name", MERGED)
def test_merged_profile_cites_its_raw_run_and_keeps_the_datasheet_node(name: str) -> None:
    """What one GPU measured cites the run in the raw CSV beside it; the node (collectives,
    NIC, gpus_per_node) stays the datasheet profile's, which one GPU cannot measure."""
    profile, base = load_profile(name), load_profile(name.removesuffix("-1gpu"))
    raw = io_profiles.profiles_dir() / f"{name}.raw.csv"
    runs = set(pd.read_csv(raw)["run_id"])
    measured = [t for t in profile.provenance.values() if t.startswith("measured: ")]
    cited = {t.split(" run ")[1].split(";")[0] for t in measured if " run " in t}
    assert cited and cited <= runs
    for key in ("matmul_efficiency.bf16", "matmul_efficiency.fp32", "attention_efficiency.bf16"):
        assert profile.provenance[key].startswith("measured: NVIDIA H100"), key
    assert profile.intra_node == base.intra_node
    assert profile.gpus_per_node == base.gpus_per_node == 8
    assert profile.nic_bytes_per_s == base.nic_bytes_per_s


def test_measured_profiles_are_not_guessed_from_a_gpu_name() -> None:
    """A published run's "H100 SXM" is the datasheet H100, not one lent VM's measurements."""
    assert set(io_profiles.list_datasheet_profiles()) == set(SHIPPED)


@pytest.mark.parametrize("name", MEASURED + MERGED)
def test_measured_profile_round_trips(name: str) -> None:
    data = _raw(name)
    assert profile_to_dict(profile_from_dict(data, source=name)) == data


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_loads_and_validates(name: str) -> None:
    profile = load_profile(name)
    assert isinstance(profile, HardwareProfile)
    assert profile.name == name
    assert set(profile.intra_node) == set(COLLECTIVES)
    assert {"bf16", "fp16"} <= set(profile.dtypes())
    assert 0 < profile.usable_memory_bytes < profile.hbm_capacity_bytes
    kinds = {"datasheet", "nccl-tests", "measured", "derived", "assumption"}
    for key, text in profile.provenance.items():
        assert text.split(":")[0].split(" ")[0] in kinds, key


def test_a100_80gb_matches_hardware_csv() -> None:
    """HW02: 312 TFLOP/s bf16/fp16 dense, 156 tf32, 19.5 fp32, 80 GB, 2039 GB/s, no fp8."""
    p = load_profile("a100-sxm4-80gb")
    assert p.peak_flops_per_s["bf16"] == 312e12
    assert p.peak_flops_per_s["fp16"] == 312e12
    assert p.peak_flops_per_s["tf32"] == 156e12
    assert p.peak_flops_per_s["fp32"] == 19.5e12
    assert "fp8" not in p.peak_flops_per_s
    assert p.hbm_capacity_bytes == 80 * 2**30
    assert p.hbm_bytes_per_s == pytest.approx(2039e9)
    assert p.gpus_per_node == 8
    assert "HW02" in p.provenance["peak_tflops.bf16"]


def test_gb200_is_one_72_gpu_nvlink_domain() -> None:
    assert load_profile("gb200-nvl72").gpus_per_node == 72


def test_gb300_is_gb200_with_more_memory_and_faster_nics() -> None:
    """HP12 note 24: GB300 NVL72 = GB200 NVL72 compute but a faster fp4 (HP12: 15000 dense
    TFLOP/s), more memory (288 GB, the B300 GPU's); HW15: 800 Gb/s per GPU on the DGX B300
    node."""
    gb200, gb300 = load_profile("gb200-nvl72"), load_profile("gb300-nvl72")
    assert gb300.gpus_per_node == 72
    assert gb300.peak_flops_per_s == {**gb200.peak_flops_per_s, "fp4": 15000e12}
    assert gb200.peak_flops_per_s["fp4"] == 10000e12
    for dtype, curve in gb200.matmul_efficiency.items():
        if dtype == "fp4":  # same fraction of a higher peak: the curve differs (roofline)
            continue
        assert (gb300.matmul_efficiency[dtype].x, gb300.matmul_efficiency[dtype].y) == (
            curve.x,
            curve.y,
        )
    for name, coll in gb200.intra_node.items():
        mine = gb300.intra_node[name]
        assert (mine.latency_s, mine.busbw_bytes_per_s.y) == (
            coll.latency_s,
            coll.busbw_bytes_per_s.y,
        )
    assert bytes_to_gib(gb300.hbm_capacity_bytes) == 288
    # reserve: 1.0 + 2.0 + 5% of 288 GB in GiB, rounded to 0.1
    assert bytes_to_gib(gb300.memory_reserve_bytes) == pytest.approx(
        round(3.0 + 0.05 * 288e9 / 2**30, 1)
    )
    assert gb300.nic_bytes_per_s == pytest.approx(800e9 / 8 * 0.94)


@pytest.mark.parametrize(("size", "t_oop", "bw_oop", "t_ip", "bw_ip"), N01_ROWS)
def test_h100_all_reduce_reproduces_n01(
    size: int, t_oop: float, bw_oop: float, t_ip: float, bw_ip: float
) -> None:
    """alpha + S*f/busbw(S) gives back N01's measured time and busbw (the faster of oop/ip)."""
    coll = load_profile("h100-sxm5-80gb").intra_node["all_reduce"]
    time_s = coll.time_s(size, 8)
    t_us, busbw = (t_oop, bw_oop) if t_oop <= t_ip else (t_ip, bw_ip)
    assert time_s * 1e6 == pytest.approx(t_us, rel=0.01)
    assert size * 2 * 7 / 8 / time_s / 1e9 == pytest.approx(busbw, rel=0.03)


def test_h100_nvls_all_reduce_beats_ring_reduce_scatter() -> None:
    """N01 (NVLS) ~480 GB/s vs N04 ring reduce_scatter ~362 GB/s at 8 GiB (N13)."""
    p = load_profile("h100-sxm5-80gb")
    size = 2**33
    assert p.intra_node["all_reduce"].busbw_bytes_per_s(size) == pytest.approx(480e9, rel=0.01)
    assert p.intra_node["reduce_scatter"].busbw_bytes_per_s(size) == pytest.approx(362e9, rel=0.01)


@pytest.mark.parametrize("name", SHIPPED)
def test_matmul_ceiling_is_the_measured_mamf(name: str) -> None:
    p = load_profile(name)
    for dtype, mamf in MAMF_TFLOPS[name].items():
        largest = p.matmul_efficiency[dtype].x[-1]
        achieved_tflops = p.matmul_flops_per_s(dtype, largest) / 1e12
        # n = 16384: compute-bound, at the MAMF but for one 5 us launch
        with_launch = largest / (largest / (mamf * 1e12) + p.kernel_launch_s) / 1e12
        assert achieved_tflops == pytest.approx(with_launch, rel=1e-3), dtype
        assert achieved_tflops == pytest.approx(mamf, rel=0.01), dtype


@pytest.mark.parametrize("name", SHIPPED)
def test_matmul_curve_is_the_documented_roofline(name: str) -> None:
    """Recompute README's roofline from the file's own numbers (4 significant digits)."""
    p = load_profile(name)
    hbm = p.streaming_bytes_per_s()
    nbytes = {"bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5625}
    mamf = MAMF_TFLOPS[name]
    for dtype, curve in p.matmul_efficiency.items():
        ceiling = mamf.get(dtype, mamf["bf16"]) * 1e12  # fp16 uses the bf16 MAMF
        for flops, fraction in zip(curve.x, curve.y, strict=True):
            n = round((flops / 2) ** (1 / 3))
            t = max(flops / ceiling, 3 * n * n * nbytes[dtype] / hbm) + p.kernel_launch_s
            assert fraction == pytest.approx(flops / t / p.peak_flops_per_s[dtype], rel=1e-3)


# --------------------------------------------------------------------------- round trip
@pytest.mark.parametrize("name", SHIPPED)
def test_round_trip_dict_profile_dict(name: str) -> None:
    data = _raw(name)
    assert profile_to_dict(profile_from_dict(data, source=name)) == data


def test_write_then_load_gives_the_same_profile(tmp_path: Path) -> None:
    original = load_profile("h200-sxm-141gb")
    target = tmp_path / "copy.yaml"
    write_profile(original, target)
    again = load_profile(str(target))
    assert profile_to_dict(again) == profile_to_dict(original)
    assert again.intra_node["all_reduce"].time_s(2**30, 8) == original.intra_node[
        "all_reduce"
    ].time_s(2**30, 8)


def test_write_refuses_a_profile_without_provenance(tmp_path: Path) -> None:
    profile = load_profile("h100-sxm5-80gb")
    kept = {k: v for k, v in profile.provenance.items() if k != "hbm_capacity_gib"}
    stripped = dataclasses.replace(profile, provenance=kept)
    with pytest.raises(InputFileError, match="hbm_capacity_gib"):
        write_profile(stripped, tmp_path / "bad.yaml")
    assert not list(tmp_path.iterdir())


# --------------------------------------------------------------------------- atomic write
def test_failed_serialisation_leaves_old_file_intact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "h100-sxm5-80gb.yaml"
    write_profile(load_profile("h100-sxm5-80gb"), target)
    before = target.read_bytes()

    def explode(*args: object, **kwargs: object) -> str:
        raise RuntimeError("disk full while serialising")

    monkeypatch.setattr(yaml, "safe_dump", explode)
    with pytest.raises(RuntimeError, match="serialising"):
        write_profile(load_profile("a100-sxm4-80gb"), target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_failed_replace_leaves_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "p.yaml"
    write_profile(load_profile("h100-sxm5-80gb"), target)
    before = target.read_bytes()

    def refuse(src: object, dst: object) -> None:
        raise OSError("replace refused")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="refused"):
        write_profile(load_profile("b200-sxm-180gb"), target)
    assert target.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["p.yaml"]


# --------------------------------------------------------------------------- bad input
def test_malformed_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\npeak_tflops: {bf16: 1\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"broken\.yaml: malformed YAML: .*line \d+"):
        load_profile(str(path))


def test_missing_key_names_file_and_key(tmp_path: Path) -> None:
    data = _raw("h100-sxm5-80gb")
    del data["intra_node"]["all_reduce"]["latency_us"]
    path = _write_yaml(tmp_path / "x.yaml", data)
    with pytest.raises(InputFileError) as info:
        load_profile(str(path))
    assert str(info.value) == f"{path}: intra_node.all_reduce.latency_us: missing required key"


def test_missing_top_level_key(tmp_path: Path) -> None:
    data = _raw("a100-sxm4-80gb")
    del data["hbm_capacity_gib"]
    path = _write_yaml(tmp_path / "x.yaml", data)
    with pytest.raises(InputFileError, match=r"x\.yaml: hbm_capacity_gib: missing required key"):
        load_profile(str(path))


def test_wrong_type_in_list_names_file_and_key(tmp_path: Path) -> None:
    data = _raw("h100-sxm5-80gb")
    data["intra_node"]["all_reduce"]["busbw_gb_per_s"] = "abc"
    path = _write_yaml(tmp_path / "x.yaml", data)
    with pytest.raises(InputFileError) as info:
        load_profile(str(path))
    assert str(info.value) == (
        f"{path}: intra_node.all_reduce.busbw_gb_per_s: expected a list of numbers, got 'abc'"
    )


@pytest.mark.parametrize(
    ("edit", "pattern"),
    [
        (lambda d: d["peak_tflops"].update(bf16="fast"), r"peak_tflops\.bf16: expected a number"),
        (lambda d: d.update(hbm_efficiency_fraction=True), "hbm_efficiency_fraction: expected a"),
        (lambda d: d.update(gpus_per_node=8.0), "gpus_per_node: expected an integer"),
        (lambda d: d.update(schema_version=2), "schema_version: 2 is not supported"),
        (lambda d: d.update(hbm_capacity_gb=80), r"unknown key\(s\) 'hbm_capacity_gb'"),
        (lambda d: d["intra_node"].pop("sendrecv"), "intra_node.sendrecv: missing required key"),
        (
            lambda d: d["intra_node"]["sendrecv"]["message_bytes"].pop(),
            r"intra_node\.sendrecv: the two lists have different lengths",
        ),
        (
            lambda d: d["matmul_efficiency"]["bf16"]["fraction_of_peak"].__setitem__(0, 1.5),
            r"matmul_efficiency\.bf16\.fraction_of_peak: values must be in \(0, 1\]",
        ),
        (
            lambda d: d["intra_node"]["all_gather"]["message_bytes"].reverse(),
            r"intra_node\.all_gather: curve\.x must be strictly increasing",
        ),
        (lambda d: d["provenance"].pop("nic_gb_per_s"), "provenance: no source given for: nic_gb"),
        (
            lambda d: d["provenance"].update({"peak_tflops.fp4": "datasheet: HW06"}),
            "provenance: entries for keys the file does not have: peak_tflops.fp4",
        ),
    ],
)
def test_invalid_field_is_reported_with_its_path(tmp_path: Path, edit: Any, pattern: str) -> None:
    data = copy.deepcopy(_raw("h100-sxm5-80gb"))
    edit(data)
    path = _write_yaml(tmp_path / "bad.yaml", data)
    with pytest.raises(InputFileError, match=rf"^{path}: .*{pattern}"):
        load_profile(str(path))


def test_dataclass_validation_is_reported_with_the_file(tmp_path: Path) -> None:
    data = _raw("a100-sxm4-40gb")
    data["memory_reserve_gib"] = 50  # > 40 GB of HBM: HardwareProfile rejects it
    path = _write_yaml(tmp_path / "reserve.yaml", data)
    with pytest.raises(InputFileError, match=rf"^{path}: .*memory_reserve_bytes"):
        load_profile(str(path))


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(InputFileError, match=r"list\.yaml: \(top level\): expected a mapping"):
        load_profile(str(path))


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputFileError, match=r"nothere\.yaml: file not found"):
        load_profile(str(tmp_path / "nothere.yaml"))


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownNameError) as info:
        load_profile("h300-sxm")
    assert info.value.known == list(EVERY)
    assert "unknown hardware profile 'h300-sxm'" in str(info.value)


def test_name_must_match_the_file_stem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = _raw("h100-sxm5-80gb")
    data["name"] = "something-else"
    _write_yaml(tmp_path / "h100-sxm5-80gb.yaml", data)
    monkeypatch.setattr(io_profiles, "profiles_dir", lambda: tmp_path)
    with pytest.raises(InputFileError, match="differs from the file name"):
        load_profile("h100-sxm5-80gb")


# --------------------------------------------------------------------------- CLI
def test_cli_list_prints_one_row_per_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["name", "hbm_gib", "usable_gib"]
    assert [line.split()[0] for line in lines[1:]] == list(EVERY)
    a100 = next(line for line in lines if line.split()[0] == "a100-sxm4-80gb")
    assert a100.split()[1:7] == ["80.0", "73.3", "312", "2.039", "8", "23.5"]
    assert "measured 4, datasheet 8, derived 10, assumption 6 NVIDIA A100" in a100


def test_cli_show_prints_numbers_with_provenance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", "h100-sxm5-80gb"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("peak_tflops.bf16"))
    assert row.split()[1] == "989"
    assert "HW03" in row
    assert "intra_node.all_reduce: nccl-tests: N01" in out
    assert "1073741824" in out and "469.4" in out  # beta busbw at 1 GiB (C0028)
    assert "matmul_efficiency.fp8" in out


@pytest.mark.parametrize("name", EVERY)
def test_cli_show_prints_every_profile(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", name]) == 0
    out = capsys.readouterr().out
    for dtype in load_profile(name).attention_efficiency:  # measured fused-attention curves
        assert f"attention_efficiency.{dtype}: measured:" in out
        assert "forward_fraction_of_peak  backward_fraction_of_peak" in out


def test_cli_show_accepts_a_path(capsys: pytest.CaptureFixture[str]) -> None:
    path = profiles_dir() / "gb200-nvl72.yaml"
    assert main(["profiles", "show", str(path)]) == 0
    assert "time_us_72_ranks" in capsys.readouterr().out


def test_cli_show_unknown_name_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", "nope"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("plansim: error: unknown hardware profile 'nope'; known: a100")


def test_cli_show_bad_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("schema_version: [\n", encoding="utf-8")
    assert main(["profiles", "show", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.yaml: malformed YAML" in err


def test_nic_and_latency_units() -> None:
    """Edge units convert: 47 GB/s -> 4.7e10 B/s (N14), 122.3 us -> 1.223e-4 s (N02 C0034)."""
    p = load_profile("h100-sxm5-80gb")
    assert p.nic_bytes_per_s == pytest.approx(47e9)
    assert p.nic_latency_s == pytest.approx(122.3e-6)
    assert p.intra_node["all_reduce"].latency_s == pytest.approx(13.0e-6)
    assert p.memory_reserve_bytes == pytest.approx(6.7 * 2**30)
    assert math.isclose(p.pcie_bytes_per_s, 55.43e9)


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("nic_latency_us: 122.3", "nic_latency_us: -122.3", "nic_latency_us: -122.3 is outside"),
        ("nic_gb_per_s: 47", "nic_gb_per_s: 1e-300", "nic_gb_per_s: 1e-300 is outside"),
        ("kernel_launch_us: 5", "kernel_launch_us: -1", "kernel_launch_us: -1 is outside"),
        (
            "hbm_bandwidth_gb_per_s: 3350",
            "hbm_bandwidth_gb_per_s: 3.35e12",
            "hbm_bandwidth_gb_per_s: 3.35e+12 is outside the plausible range [0.01, 1e+06]",
        ),
        ("    latency_us: 13", "    latency_us: -13", "intra_node.all_reduce.latency_us: -13"),
    ],
)
def test_implausible_numbers_are_refused_naming_the_key(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    text = (io_profiles.profiles_dir() / "h100-sxm5-80gb.yaml").read_text()
    assert old in text
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(InputFileError, match=re.escape(key)):
        load_profile(str(path))


def test_a_number_yaml_reads_as_text_is_read_as_the_number(tmp_path: Path) -> None:
    text = (io_profiles.profiles_dir() / "h100-sxm5-80gb.yaml").read_text()
    path = tmp_path / "p.yaml"
    path.write_text(text.replace("nic_gb_per_s: 47", "nic_gb_per_s: 4.7e1", 1))
    assert load_profile(str(path)).nic_bytes_per_s == pytest.approx(47e9)
