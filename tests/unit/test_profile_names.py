"""GPU names as runs tables spell them -> shipped profiles (plansim.io.profile_names), and the
back-test reading them."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.errors import UnknownNameError
from plansim.io.profile_names import match_profile_name
from plansim.io.profiles import list_datasheet_profiles
from plansim.io.runs import read_runs
from plansim.planner.backtest import predict_row
from tests.unit.test_backtest_robustness import RUNS

KNOWN = list_datasheet_profiles()


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("a100-sxm4-80gb", "a100-sxm4-80gb"),
        ("A100-SXM4-80GB", "a100-sxm4-80gb"),
        ("NVIDIA A100 SXM 80GB", "a100-sxm4-80gb"),
        ("a100_sxm4_40gb", "a100-sxm4-40gb"),
        ("H100 SXM", "h100-sxm5-80gb"),
        ("GB200 NVL72", "gb200-nvl72"),
        ("NVIDIA B200", "b200-sxm-180gb"),
        ("AMD Instinct MI300X", "mi300x-192gb"),
    ],
)
def test_spellings_of_a_shipped_gpu_name_its_profile(text: str, name: str) -> None:
    assert match_profile_name(text, KNOWN) == name


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a100", "ambiguous: a100-sxm4-40gb, a100-sxm4-80gb"),
        ("H100 PCIe", "unknown hardware profile 'H100 PCIe'"),  # not the SXM part
        ("H100 80GB HBM2e", "unknown hardware profile"),  # the PCIe card's memory
        ("v100", "unknown hardware profile 'v100'"),
        ("", "unknown hardware profile ''"),
    ],
)
def test_ambiguous_or_unknown_text_is_not_guessed(text: str, why: str) -> None:
    with pytest.raises(UnknownNameError) as err:
        match_profile_name(text, KNOWN)
    assert why in str(err.value)


def test_the_back_test_reads_a_spelled_out_gpu_and_skips_an_ambiguous_one(tmp_path: Path) -> None:
    lines = RUNS.read_text(encoding="utf-8").splitlines()
    row = next(line for line in lines if line.startswith("T0024,"))
    spelled = row.replace("a100-sxm4-80gb", "A100 SXM4 80GB", 1)
    bare = row.replace("a100-sxm4-80gb", "A100", 1)
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([lines[0], row, spelled, bare]) + "\n", encoding="utf-8")
    exact, read, skipped = (predict_row(r) for r in read_runs(path)[1])
    assert read.predicted_step_time_s == exact.predicted_step_time_s
    assert "gpu_type 'A100 SXM4 80GB' read as a100-sxm4-80gb" in read.note
    assert skipped.predicted_step_time_s is None
    assert "ambiguous: a100-sxm4-40gb, a100-sxm4-80gb" in skipped.note


def test_the_back_test_reads_an_h100_as_the_datasheet_profile_not_a_measured_one(
    tmp_path: Path,
) -> None:
    """hardware_profiles/ also holds h100-sxm5-80gb-1gpu (one lent H100, measured): a run's
    "H100 SXM" still names the datasheet profile, and the measured one is read by its name."""
    lines = RUNS.read_text(encoding="utf-8").splitlines()
    row = next(line for line in lines if line.startswith("T0024,"))
    spelled = row.replace("a100-sxm4-80gb", "H100 SXM", 1)
    measured = row.replace("a100-sxm4-80gb", "h100-sxm5-80gb-1gpu", 1)
    path = tmp_path / "runs.csv"
    path.write_text("\n".join([lines[0], spelled, measured]) + "\n", encoding="utf-8")
    read, by_name = (predict_row(r) for r in read_runs(path)[1])
    assert "gpu_type 'H100 SXM' read as h100-sxm5-80gb" in read.note
    assert read.predicted_step_time_s is not None
    assert by_name.predicted_step_time_s is not None
    assert by_name.predicted_step_time_s != read.predicted_step_time_s
