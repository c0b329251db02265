"""The cluster's NICs as an input: the per-GPU inter-node bandwidth they give, and the
runs-file columns that state them."""

from __future__ import annotations

from pathlib import Path

import pytest

from plansim.cli import main
from plansim.errors import SpecError
from plansim.io.profiles import load_profile
from plansim.specs.cluster_network import (
    NIC_EFFICIENCY_FRACTION,
    node_nic_bytes_per_s,
    with_node_nics,
)

EXTRA = Path(__file__).resolve().parents[2] / "benchmarks" / "published_runs"


def test_jean_zay_nics_give_each_gpu_an_eighth_of_a_dgx_rail() -> None:
    """4 x 100 Gb/s per 8 GPUs: 50 GB/s of line rate shared by 8, at NCCL's 0.94 of it;
    8 x 200 Gb/s HDR (a DGX A100) gives the profile's own 23.5 GB/s back."""
    a100 = load_profile("a100-sxm4-80gb")
    jean_zay = node_nic_bytes_per_s(a100, nics_per_node=4, nic_line_bits_per_s=100e9)
    assert jean_zay == pytest.approx(4 * 12.5e9 * 0.94 / 8)
    dgx = with_node_nics(a100, nics_per_node=8, nic_line_bits_per_s=200e9)
    assert dgx.nic_bytes_per_s == pytest.approx(a100.nic_bytes_per_s)
    assert dgx.nic_latency_s == a100.nic_latency_s
    assert NIC_EFFICIENCY_FRACTION == 0.94


@pytest.mark.parametrize(
    ("nics", "rate", "match"),
    [
        (0, 100e9, "nics_per_node"),
        (2.5, 100e9, "nics_per_node"),
        (4, 0.0, "line rate"),
        (4, float("inf"), "line rate"),
        (4, True, "line rate"),
    ],
)
def test_bad_nics_are_refused(nics: object, rate: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        node_nic_bytes_per_s(
            load_profile("a100-sxm4-80gb"),
            nics_per_node=nics,  # type: ignore[arg-type]
            nic_line_bits_per_s=rate,  # type: ignore[arg-type]
        )


def _one_bloom_row(tmp_path: Path, **cells: str) -> Path:
    lines = (EXTRA / "bloom_layout_search.csv").read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    import csv
    import io

    row = next(csv.DictReader(io.StringIO("\n".join(lines[:2]))))
    row.update(cells)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=header, lineterminator="\n")
    writer.writeheader()
    writer.writerow(row)
    path = tmp_path / "runs.csv"
    path.write_text(out.getvalue(), encoding="utf-8")
    return path


def _predicted_s(out: str) -> float:
    line = next(line for line in out.splitlines() if line.startswith("B0001"))
    return float(line.split("  384 ")[1].split()[1])


def test_stated_nics_slow_a_row_that_crosses_nodes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The BLOOM search row on Jean Zay's NICs is predicted slower than on the profile's
    DGX rails, and the note names the NICs; half the pair or a zero rate skips the row with
    the reason (exit 1: no row predicted)."""
    assert main(["backtest", str(_one_bloom_row(tmp_path))]) == 0
    stated = _predicted_s(capsys.readouterr().out)
    dgx = _one_bloom_row(tmp_path, nics_per_node="", nic_gbit_per_s="", fabric="")
    assert main(["backtest", str(dgx)]) == 0
    assert stated > _predicted_s(capsys.readouterr().out)
    out = tmp_path / "pred.csv"
    assert main(["backtest", str(_one_bloom_row(tmp_path)), "--out", str(out)]) == 0
    assert "cluster NICs 4 x 100 Gb/s Omni-Path per 8 GPUs" in out.read_text(encoding="utf-8")
    assert main(["backtest", str(_one_bloom_row(tmp_path, nic_gbit_per_s=""))]) == 1
    assert "nics_per_node and nic_gbit_per_s go together" in capsys.readouterr().out
    assert main(["backtest", str(_one_bloom_row(tmp_path, nic_gbit_per_s="0"))]) == 1
    assert "nic_gbit_per_s 0.0 is not a positive number of Gb/s" in capsys.readouterr().out


def _step_s(argv: list[str], capsys: pytest.CaptureFixture[str]) -> float:
    import json

    assert main([*argv, "--format", "json"]) == 0
    return float(json.loads(capsys.readouterr().out)["step_time_s"])


def test_simulate_and_plan_take_the_cluster_nics(capsys: pytest.CaptureFixture[str]) -> None:
    """--nics-per-node / --nic-gbit-per-s slow a layout whose DP crosses nodes; one without
    the other, a zero rate, or with --save-plan is one clear error (exit 2)."""
    sim = [
        "simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "32",
        "--gbs", "64", "--tp", "1", "--pp", "1", "--mbs", "2",
    ]  # fmt: skip
    base = _step_s(sim, capsys)
    slow = _step_s([*sim, "--nics-per-node", "4", "--nic-gbit-per-s", "100"], capsys)
    assert slow > base
    assert main([*sim, "--nics-per-node", "4"]) == 2
    assert "--nics-per-node and --nic-gbit-per-s go together" in capsys.readouterr().err
    assert main([*sim, "--nics-per-node", "4", "--nic-gbit-per-s", "0"]) == 2
    assert "--nic-gbit-per-s must be a positive number" in capsys.readouterr().err
    plan = [
        "plan",
        "--model",
        "megatron-1.7b",
        "--gpu",
        "a100-sxm4-80gb",
        "--gpus",
        "32",
        "--gbs",
        "64",
    ]
    nics = ["--nics-per-node", "4", "--nic-gbit-per-s", "100"]
    assert main([*plan, *nics, "--save-plan", "x.yaml"]) == 2
    assert "--save-plan writes the profile by name" in capsys.readouterr().err
