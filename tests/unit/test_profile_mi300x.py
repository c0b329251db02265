"""The AMD Instinct MI300X profile (``hardware_profiles/mi300x-192gb.yaml``).

Oracles are numbers from ../shared/reference (hardware.csv row HW08, comm.csv rows C0159 and
C0160, source N10), copied here with their ids so the tests run without that folder.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from plansim.cli import main
from plansim.io.profiles import list_profiles, load_profile
from plansim.specs.curves import COLLECTIVES, CollectiveCurve, bus_factor
from plansim.specs.hardware import HardwareProfile

NAME = "mi300x-192gb"

#: HW08 dense peaks, TFLOP/s (bf16: AMD's 1307.4 from the row's note; the others as rounded).
PEAK_TFLOPS = {"bf16": 1307.4, "fp16": 1300.0, "fp8": 2610.0, "tf32": 653.7, "fp32": 163.4}
#: HW08 measured MAMF bf16 (H04, torch 2.5.1+rocm6.3 with TunableOp), TFLOP/s.
MAMF_BF16_TFLOPS = 668.4
#: HW08: 192 GB HBM3 (read in GiB, README "Capacity convention"), 5.3 TB/s.
HBM_GIB = 192
HBM_GB_PER_S = 5300
#: N10 (torch all_reduce_bench, one 8x MI300X node): message bytes, GPUs, busbw GB/s.
C0160 = (2**32, 8, 312.912)
C0159 = (2**32, 2, 47.671)


@pytest.fixture(scope="module")
def profile() -> HardwareProfile:
    return load_profile(NAME)


def _measured_busbw_gb_per_s(collective: CollectiveCurve, size: int, ranks: int) -> float:
    """nccl-tests busbw of one call, latency included: S * f / t."""
    return size * bus_factor(collective.collective, ranks) / collective.time_s(size, ranks) / 1e9


def test_profile_is_listed_and_loads(profile: HardwareProfile) -> None:
    assert NAME in list_profiles()
    assert profile.name == NAME
    assert profile.gpus_per_node == 8
    assert set(profile.intra_node) == set(COLLECTIVES)
    assert profile.dtypes() == ("bf16", "fp16", "fp8")
    kinds = {"datasheet", "nccl-tests", "measured", "derived", "assumption"}
    for key, text in profile.provenance.items():
        assert text.split(":")[0].split(" ")[0] in kinds, key


def test_peaks_and_hbm_match_hw08(profile: HardwareProfile) -> None:
    for dtype, tflops in PEAK_TFLOPS.items():
        assert profile.peak_flops_per_s[dtype] == pytest.approx(tflops * 1e12), dtype
        assert "HW08" in profile.provenance[f"peak_tflops.{dtype}"], dtype
    assert profile.hbm_capacity_bytes == HBM_GIB * 2**30
    assert profile.hbm_bytes_per_s == pytest.approx(HBM_GB_PER_S * 1e9)
    # 1.0 context + 2.0 collective buffers + 5% of 192 GB (8.94 GiB) = 11.94 -> 11.9 GiB
    assert profile.memory_reserve_bytes == pytest.approx(11.9 * 2**30)


def test_matmul_plateau_is_mamf_over_peak(profile: HardwareProfile) -> None:
    """n = 16384 is compute-bound: fraction = MAMF / peak less one 5 us launch on ~13 ms."""
    bf16 = profile.matmul_efficiency["bf16"]
    assert bf16.y[-1] == pytest.approx(MAMF_BF16_TFLOPS / PEAK_TFLOPS["bf16"], rel=0.001)
    largest = bf16.x[-1]
    for dtype in ("bf16", "fp16"):  # fp16 reuses the bf16 MAMF: same absolute rate
        achieved = profile.matmul_flops_per_s(dtype, largest) / 1e12
        assert achieved == pytest.approx(MAMF_BF16_TFLOPS, rel=0.001), dtype


def test_fp8_curve_is_the_documented_assumption(profile: HardwareProfile) -> None:
    """HW08 gives no fp8 MAMF: the fp8 curve assumes bf16's measured fraction of peak, and its
    provenance says it is an assumption."""
    largest = profile.matmul_efficiency["fp8"].x[-1]
    fraction = MAMF_BF16_TFLOPS / PEAK_TFLOPS["bf16"]
    achieved = profile.matmul_flops_per_s("fp8", largest) / 1e12
    assert achieved == pytest.approx(fraction * PEAK_TFLOPS["fp8"], rel=0.001)
    assert profile.provenance["matmul_efficiency.fp8"].startswith("assumption:")


def test_all_reduce_on_8_gpus_at_4_gib_reproduces_c0160(profile: HardwareProfile) -> None:
    size, ranks, busbw = C0160
    all_reduce = profile.intra_node["all_reduce"]
    assert _measured_busbw_gb_per_s(all_reduce, size, ranks) == pytest.approx(busbw, rel=1e-3)
    assert "C0160" in profile.provenance["intra_node.all_reduce"]


def test_sendrecv_is_one_xgmi_link_as_in_c0159(profile: HardwareProfile) -> None:
    """The 2-GPU all_reduce's busbw is what one rank sends over its one link per second."""
    size, ranks, busbw = C0159
    all_reduce_2 = size * bus_factor("all_reduce", ranks) / (busbw * 1e9)
    sendrecv = profile.intra_node["sendrecv"]
    assert sendrecv.time_s(size, ranks) == pytest.approx(all_reduce_2, rel=1e-3)
    assert "C0159" in profile.provenance["intra_node.sendrecv"]


@pytest.mark.parametrize(
    ("collective", "ratio"), [("all_gather", 361.4), ("reduce_scatter", 362.9)]
)
def test_ring_collectives_follow_the_n05_ratios(
    profile: HardwareProfile, collective: str, ratio: float
) -> None:
    """all_gather / reduce_scatter = all_reduce x N05's ratio to ring all_reduce (367.2)."""
    size = C0160[0]
    expected = profile.intra_node["all_reduce"].busbw_bytes_per_s(size) * ratio / 367.2
    got = profile.intra_node[collective].busbw_bytes_per_s(size)
    assert got == pytest.approx(expected, rel=1e-3)


def test_network_and_host_link(profile: HardwareProfile) -> None:
    """One 400 Gb/s NDR NIC per GPU (HP09) at N14's 47 GB/s; PCIe Gen5 x16 (N12 C0166)."""
    assert profile.nic_bytes_per_s == pytest.approx(47e9)
    assert "HP09" in profile.provenance["nic_gb_per_s"]
    assert profile.nic_latency_s == pytest.approx(122.3e-6)
    assert profile.pcie_bytes_per_s == pytest.approx(55.43e9)


def test_cli_show_prints_the_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profiles", "show", NAME]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip().startswith("peak_tflops.bf16"))
    assert row.split()[1] == "1307.4" and "HW08" in row
    assert "intra_node.all_reduce" in out and "C0160" in out


def test_llama2_70b_on_64_mi300x_simulates(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "llama2-70b", "--gpu", NAME, "--gpus", "64", "--gbs", "128"]
    args += ["--tp", "8", "--pp", "2", "--mbs", "1", "--recompute", "selective"]
    assert main([*args, "--sequence-parallel", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["status"] == "ok" and doc["profile"] == NAME
    assert doc["plan"]["dp"] == 4
    assert math.isfinite(doc["step_time_s"]) and doc["step_time_s"] > 0
    # MFU is below the bf16 matmul ceiling MAMF / peak = 0.511
    assert 0 < doc["mfu"] < MAMF_BF16_TFLOPS / PEAK_TFLOPS["bf16"]


def test_backtest_row_on_mi300x_is_predicted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row with gpu_type mi300x-192gb is predicted, not skipped. The step time is a
    placeholder (no published MI300X run in the reference data), so the error means nothing."""
    row = {
        "row_id": "M1",
        "model_name": "tiny",
        "num_layers": "24",
        "hidden_size": "2304",
        "num_attention_heads": "24",
        "seq_len_tokens": "2048",
        "vocab_size": "51200",
        "gpu_type": NAME,
        "num_gpus": "8",
        "tp": "1",
        "pp": "1",
        "dp": "8",
        "cp": "1",
        "micro_batch_size_seqs": "4",
        "global_batch_size_seqs": "64",
        "recompute": "full",
        "zero_stage": "0",
        "sequence_parallel": "no",
        "precision": "bf16",
        "step_time_s": "1.0",
    }
    runs = tmp_path / "runs.csv"
    with runs.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(row))
        writer.writeheader()
        writer.writerow(row)
    out_csv = tmp_path / "pred.csv"
    assert main(["backtest", str(runs), "--out", str(out_csv)]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("backtest: 1 runs, 0 ")
    (pred,) = list(csv.DictReader(out_csv.open()))
    assert pred["status"] == "ok", pred["note"]
    assert math.isfinite(float(pred["predicted_step_time_s"]))
    assert float(pred["predicted_step_time_s"]) > 0
