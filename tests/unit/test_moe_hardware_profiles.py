"""The H800 and DGX B300 datasheet profiles (``hardware_profiles/h800-sxm5-80gb.yaml``,
``hardware_profiles/dgx-b300.yaml``), the ``gpu_type`` names of
``../shared/reference/moe_runs.csv``.

Oracles are the figures the files cite (hardware_profiles/README.md, sources HP14-HP20 and
../shared/reference ids), copied here so the tests run without either folder:

* HP15 (Zhao et al., ISCA '25, arXiv:2505.09343) 4.1: the H800 SXM is the H100's Hopper GPU with
  FP64 and NVLink cut, NVLink per GPU 900 -> 400 GB/s, eight 400G InfiniBand NICs per node;
  4.3: "about 160GB/s can actually be achieved" on NVLink. HP14 (DeepSeek-V3 report) 3.1: 8 GPUs
  per node; 3.2.2: NVLink 160 GB/s, IB 50 GB/s. HP16 (DeepEP): 153/158 GB/s intranode EP8 on
  H800 NVLink, 43 GB/s RDMA at EP16.
* HP18 (ml-engineering, row NVIDIA B300 SXM): dense bf16 2250, fp8 4500, fp4 12600 TFLOP/s,
  8.00 TB/s; MAMF bf16 1769.0, fp8 3353.3. HP19 (NVIDIA's DGX B300 system description): 270 GB
  per GPU, 8 GPUs. HP20: 2.3 TB HBM3e per DGX B300 (8 x 288 GB physical). HW15: 8 x 800 Gb/s.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from plansim.cli import main
from plansim.io.profile_names import match_profile_name
from plansim.io.profiles import (
    list_datasheet_profiles,
    list_profiles,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    profiles_dir,
)
from plansim.specs.curves import COLLECTIVES
from plansim.specs.hardware import HardwareProfile
from plansim.units import bytes_to_gib

H800, B300 = "h800-sxm5-80gb", "dgx-b300"
NEW = (H800, B300)
KINDS = ("datasheet", "nccl-tests", "measured", "derived", "assumption")

#: HP15 4.1: NVLink bandwidth per H800 GPU over the H100's (400 / 900 GB/s).
NVLINK_RATIO = 400 / 900
#: HP15 4.3 / HP14 3.2.2: achievable H800 NVLink bandwidth per GPU, GB/s.
H800_NVLINK_ACHIEVED = 160.0
#: HP16: DeepEP intranode EP8 dispatch / combine on H800 (NVLink bottleneck), GB/s.
DEEPEP_INTRANODE = (153.0, 158.0)
#: HP18 row NVIDIA B300 SXM, dense TFLOP/s.
B300_PEAK_TFLOPS = {"bf16": 2250, "fp16": 2250, "fp8": 4500, "fp4": 12600, "tf32": 1125, "fp32": 80}
#: HP18 MAMF (B300 SXM, torch 2.9.1+cu130); fp4: the B200's NVFP4 fraction (HP13, 5500 / 9000).
B300_MAMF_TFLOPS = {"bf16": 1769.0, "fp16": 1769.0, "fp8": 3353.3, "fp4": 5500.0 / 9000 * 12600}


def _raw(name: str) -> dict[str, Any]:
    data = yaml.safe_load((profiles_dir() / f"{name}.yaml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def h800() -> HardwareProfile:
    return load_profile(H800)


@pytest.fixture(scope="module")
def h100() -> HardwareProfile:
    return load_profile("h100-sxm5-80gb")


@pytest.fixture(scope="module")
def b300() -> HardwareProfile:
    return load_profile(B300)


@pytest.fixture(scope="module")
def b200() -> HardwareProfile:
    return load_profile("b200-sxm-180gb")


# --------------------------------------------------------------------------- both profiles
@pytest.mark.parametrize("name", NEW)
def test_loads_by_name_as_a_datasheet_profile(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert name in list_profiles()
    assert name in list_datasheet_profiles()  # no .raw.csv: runs' gpu_type may name it
    assert set(profile.intra_node) >= set(COLLECTIVES)
    assert {"bf16", "fp16", "fp8"} <= set(profile.dtypes())
    assert profile.gpus_per_node == 8
    assert 0 < profile.usable_memory_bytes < profile.hbm_capacity_bytes


@pytest.mark.parametrize("name", NEW)
def test_every_number_has_a_source_of_a_known_kind(name: str) -> None:
    profile = load_profile(name)
    for key, text in profile.provenance.items():
        assert text.strip().lower().startswith(KINDS), f"{key}: {text[:60]!r}"
    readme = (profiles_dir() / "README.md").read_text(encoding="utf-8")
    cited = {m for text in profile.provenance.values() for m in re.findall(r"\bHP\d\d\b", text)}
    assert cited, name
    for hp in cited:  # every HP.. id the file cites has a row in the README's source table
        assert f"| {hp} |" in readme, hp
    assert f"`{name}.yaml`" in readme  # and the file has its row in the README's file table


@pytest.mark.parametrize("name", NEW)
def test_round_trips(name: str) -> None:
    data = _raw(name)
    assert profile_to_dict(profile_from_dict(data, source=name)) == data


@pytest.mark.parametrize("name", NEW)
def test_cli_show_prints_it(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{name}: ")
    assert "intra_node.all_reduce: derived:" in out


def test_runs_tables_gpu_names_find_them_and_the_old_ones_still_resolve() -> None:
    known = list_datasheet_profiles()
    assert match_profile_name("h800-sxm5-80gb", known) == H800
    assert match_profile_name("NVIDIA H800", known) == H800
    assert match_profile_name("dgx-b300", known) == B300
    assert match_profile_name("DGX B300", known) == B300
    assert match_profile_name("H100 SXM", known) == "h100-sxm5-80gb"
    assert match_profile_name("NVIDIA B200", known) == "b200-sxm-180gb"
    assert match_profile_name("GB300 NVL72", known) == "gb300-nvl72"


# --------------------------------------------------------------------------- H800
def test_h800_compute_and_memory_are_the_h100s(
    h800: HardwareProfile, h100: HardwareProfile
) -> None:
    """HP15 4.1: the same Hopper GPU; only FP64 and NVLink differ."""
    assert h800.peak_flops_per_s == h100.peak_flops_per_s
    assert h800.peak_flops_per_s["bf16"] == 989e12 and h800.peak_flops_per_s["fp8"] == 1979e12
    for dtype, curve in h100.matmul_efficiency.items():
        mine = h800.matmul_efficiency[dtype]
        assert (mine.x, mine.y) == (curve.x, curve.y), dtype
    assert h800.hbm_capacity_bytes == 80 * 2**30 == h100.hbm_capacity_bytes
    assert h800.hbm_bytes_per_s == pytest.approx(3350e9)
    assert h800.memory_reserve_bytes == h100.memory_reserve_bytes
    assert h800.ampere_attention_fraction_of_peak == h100.ampere_attention_fraction_of_peak


def test_h800_nvlink_is_400_of_900_at_large_messages(
    h800: HardwareProfile, h100: HardwareProfile
) -> None:
    for name in COLLECTIVES:
        slow, fast = h800.intra_node[name], h100.intra_node[name]
        largest = fast.busbw_bytes_per_s.x[-1]
        assert slow.busbw_bytes_per_s(largest) == pytest.approx(
            NVLINK_RATIO * fast.busbw_bytes_per_s(largest), rel=2e-3
        ), name
        for size in (2**30, 2**33):  # bandwidth-bound sizes: well below the H100
            assert slow.busbw_bytes_per_s(size) < 0.5 * fast.busbw_bytes_per_s(size), name
        assert slow.latency_s == fast.latency_s, name


def test_h800_curves_are_the_h100s_plus_the_narrower_links_wire_time(
    h800: HardwareProfile, h100: HardwareProfile
) -> None:
    """busbw_H800(S) = 1 / (1/busbw_H100(S) + 1/(r B) - 1/B), B the H100 curve's last value."""
    for name in COLLECTIVES:
        slow, fast = (
            h800.intra_node[name].busbw_bytes_per_s,
            h100.intra_node[name].busbw_bytes_per_s,
        )
        assert slow.x == fast.x, name
        plateau = fast.y[-1]
        extra = 1 / (NVLINK_RATIO * plateau) - 1 / plateau
        for size, mine, theirs in zip(slow.x, slow.y, fast.y, strict=True):
            assert mine == pytest.approx(1 / (1 / theirs + extra), rel=1e-3), (name, size)
            assert mine <= theirs, (name, size)


def test_h800_small_messages_keep_the_h100_time(
    h800: HardwareProfile, h100: HardwareProfile
) -> None:
    """Latency-bound sizes: a few % slower at most (the wire time is small beside alpha)."""
    for name in COLLECTIVES:
        for size in (1024, 8192, 65536):
            t800, t100 = (
                h800.intra_node[name].time_s(size, 8),
                h100.intra_node[name].time_s(size, 8),
            )
            assert t100 <= t800 <= 1.05 * t100, (name, size)
        big = 2**30  # and bandwidth-bound ones are about 900/400 = 2.25x slower
        ratio = h800.intra_node[name].time_s(big, 8) / h100.intra_node[name].time_s(big, 8)
        assert 2.0 < ratio < 2.26, name


def test_h800_point_to_point_matches_what_deepseek_measured(h800: HardwareProfile) -> None:
    """The derived sendrecv plateau lands on HP14/HP15's 160 GB/s and above DeepEP's kernels."""
    plateau = h800.intra_node["sendrecv"].busbw_bytes_per_s.y[-1] / 1e9
    assert plateau == pytest.approx(H800_NVLINK_ACHIEVED, rel=0.05)
    assert plateau > max(DEEPEP_INTRANODE)
    assert plateau < 200  # HP15 4.3: 200 GB/s per direction on the wire


def test_h800_node_and_network(h800: HardwareProfile, h100: HardwareProfile) -> None:
    """HP14 3.1: 8 GPUs per node; HP15 4.1: one 400G IB NIC per GPU -> N14's 47 GB/s."""
    assert h800.gpus_per_node == 8
    assert h800.nic_bytes_per_s == pytest.approx(47e9) == h100.nic_bytes_per_s
    assert 43e9 <= h800.nic_bytes_per_s <= 50e9  # HP16 measured RDMA, HP14 line rate
    assert h800.nic_latency_s == h100.nic_latency_s
    mine, theirs = h800.inter_node_ring_fraction, h100.inter_node_ring_fraction
    assert mine is not None and theirs is not None
    assert (mine.x, mine.y) == (theirs.x, theirs.y)
    assert "N16" in h800.provenance["inter_node_ring_scaling"]


# --------------------------------------------------------------------------- DGX B300
def test_b300_hbm_capacity_is_the_exposed_270_of_the_datasheets_288(b300: HardwareProfile) -> None:
    """HP19: 270 GB per GPU; HP20: 2.3 TB per 8 GPUs = 288 physical; 270 = 288 x 15/16 as
    B200's 180 of 192."""
    assert b300.hbm_capacity_bytes == 270 * 2**30
    assert bytes_to_gib(b300.hbm_capacity_bytes) == 288 * 15 / 16
    assert pytest.approx(2300, rel=0.01) == 8 * 288  # the datasheet's "2.3 TB" total
    assert bytes_to_gib(b300.memory_reserve_bytes) == pytest.approx(
        round(3.0 + 0.05 * 270e9 / 2**30, 1)
    )
    assert b300.hbm_bytes_per_s == pytest.approx(8000e9)


def test_b300_peaks_and_matmul_ceilings(b300: HardwareProfile) -> None:
    for dtype, tflops in B300_PEAK_TFLOPS.items():
        assert b300.peak_flops_per_s[dtype] == pytest.approx(tflops * 1e12), dtype
    for dtype, mamf in B300_MAMF_TFLOPS.items():
        largest = b300.matmul_efficiency[dtype].x[-1]
        achieved = b300.matmul_flops_per_s(dtype, largest) / 1e12
        with_launch = largest / (largest / (mamf * 1e12) + b300.kernel_launch_s) / 1e12
        assert achieved == pytest.approx(with_launch, rel=1e-3), dtype
    hbm = b300.streaming_bytes_per_s()
    nbytes = {"bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5625}
    for dtype, curve in b300.matmul_efficiency.items():  # README's roofline, 4 digits
        for flops, fraction in zip(curve.x, curve.y, strict=True):
            n = round((flops / 2) ** (1 / 3))
            t = max(flops / (B300_MAMF_TFLOPS[dtype] * 1e12), 3 * n * n * nbytes[dtype] / hbm)
            t += b300.kernel_launch_s
            assert fraction == pytest.approx(flops / t / b300.peak_flops_per_s[dtype], rel=1e-3)


def test_b300_nvlink_is_the_b200s_and_the_nics_are_800g(
    b300: HardwareProfile, b200: HardwareProfile
) -> None:
    """HP19: 18x NVLink 5, 14.4 TB/s per node, as HGX B200 (HW06); HW15: 8 x 800 Gb/s."""
    for name in COLLECTIVES:
        mine, theirs = b300.intra_node[name], b200.intra_node[name]
        assert mine.latency_s == theirs.latency_s, name
        assert (mine.busbw_bytes_per_s.x, mine.busbw_bytes_per_s.y) == (
            theirs.busbw_bytes_per_s.x,
            theirs.busbw_bytes_per_s.y,
        ), name
    assert b300.gpus_per_node == 8
    assert b300.nic_bytes_per_s == pytest.approx(800e9 / 8 * 0.94)
    assert b300.nic_bytes_per_s > 1.9 * b200.nic_bytes_per_s
    assert b300.gpu_matmul_spread_fraction == b200.gpu_matmul_spread_fraction


def test_b300_files_cite_the_datasheet_figures() -> None:
    text = (profiles_dir() / f"{B300}.yaml").read_text(encoding="utf-8")
    for needle in ("270 GB", "2.3 TB", "1769.0", "3353.3", "14.4 TB/s", "HW15"):
        assert needle in text, needle
    assert Path(profiles_dir() / f"{B300}.raw.csv").exists() is False
