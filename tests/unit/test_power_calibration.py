"""GPU power as calibrate measures it (NVML readings through the sustained GEMM item) and
as energy uses it (power by activity)."""

from __future__ import annotations

import dataclasses
import math
import time

import pandas as pd
import pytest
import torch

from plansim.analytic.run_energy import StepActivity, power_draw, step_gpu_energy_j
from plansim.calibrate.bench_sustained import PowerSampler, power_reader
from plansim.calibrate.build_terms import power_term
from plansim.errors import SpecError
from plansim.io.profiles import load_profile


def _power_row(rank: int, op: str, watts: float, readings: int) -> dict[str, object]:
    return {
        "kind": "sustained",
        "op": op,
        "dtype": "bf16",
        "shape": "8192x8192x8192x15000",
        "rank": rank,
        "status": "ok",
        "reps": readings,
        "work": watts,
        "work_unit": "W",
        "median_s": 3.7,
    }


def test_power_term_takes_the_median_over_ranks_of_each_ranks_mean() -> None:
    rows = pd.DataFrame(
        [
            _power_row(0, "power_gemm", 690.0, 74),
            _power_row(1, "power_gemm", 700.0, 74),
            _power_row(2, "power_gemm", 660.0, 73),
            _power_row(0, "power_idle", 80.0, 14),
            _power_row(1, "power_idle", 90.0, 14),
            _power_row(2, "power_idle", 85.0, 14),
            {**_power_row(0, "gemm_sustained", math.nan, 10), "work_unit": "FLOP"},
        ]
    )
    terms = power_term(rows, source="measured: H100")
    assert terms.scalars == {"max_power_w": 690.0, "idle_power_w": 85.0}
    assert terms.provenance["max_power_w"].startswith("measured: H100; torch.cuda.power_draw")
    assert (
        "3 ranks" in terms.provenance["idle_power_w"]
        and "42 readings" in terms.provenance["idle_power_w"]
    )
    assert power_term(rows[rows["op"] == "gemm_sustained"], source="x").scalars == {}


def test_the_sampler_reads_until_stopped_and_cpu_runs_read_nothing() -> None:
    sampler = PowerSampler.start(lambda: 123.0)
    time.sleep(0.3)
    readings = sampler.stop()
    assert len(readings) >= 3 and {w for _, w in readings} == {123.0}
    times = [t for t, _ in readings]
    assert times == sorted(times)
    assert PowerSampler.start(None).stop() == []
    assert power_reader(torch.device("cpu")) is None


def test_measured_idle_power_lowers_the_energy_of_a_step_with_bubbles() -> None:
    datasheet = load_profile("h100-sxm5-80gb")
    step = StepActivity(compute_s=6.0, communication_s=1.0, idle_s=3.0)
    upper = step_gpu_energy_j(step, power_draw(datasheet), num_gpus=8)
    assert upper == pytest.approx(8 * 700.0 * 10.0)
    measured = dataclasses.replace(
        datasheet,
        max_power_w=690.0,
        idle_power_w=85.0,
        provenance={**datasheet.provenance, "max_power_w": "measured: H100", "idle_power_w": "x"},
    )
    power = power_draw(measured)
    assert power.basis == "measured power by activity, communication at max power (upper bound)"
    assert step_gpu_energy_j(step, power, num_gpus=8) == pytest.approx(
        8 * (690.0 * 7.0 + 85.0 * 3.0)
    )


def test_energy_needs_a_power_figure() -> None:
    bare = dataclasses.replace(load_profile("dgx-b300"), max_power_w=None)
    with pytest.raises(SpecError, match="has no max_power_w"):
        power_draw(bare)
