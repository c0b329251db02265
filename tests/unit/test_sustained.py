"""The GEMM rate a synchronous job sustains (``plansim.analytic.sustained``): the profile's
``sustained_matmul_fraction`` (power limit) and ``gpu_matmul_spread_fraction`` (the slowest of
N GPUs sets the pace).

Oracles: Blom's approximation z_N = Phi^-1((N - 0.375) / (N + 0.25)) from tables of the
standard normal (z_8: Phi^-1(0.92424) = 1.4338; z_40: Phi^-1(0.98447) = 2.1567), and the
cited figures in the profiles' provenance recomputed by hand.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from plansim.analytic.cost import build_pipeline_work
from plansim.analytic.sustained import (
    dtype_pace_fraction,
    expected_slowest_z,
    job_compute_profile,
    sustained_pace_fraction,
)
from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.errors import InputFileError, SpecError
from plansim.io.profile_parse import profile_from_dict
from plansim.io.profiles import load_profile, profile_to_dict
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.specs.plan import plan_from_fields
from tests.unit.synthetic import profile_dict_provenance_keys, round_profile


def test_expected_slowest_z_follows_blom() -> None:
    assert expected_slowest_z(1) == 0.0
    assert expected_slowest_z(8) == pytest.approx(1.4338, abs=5e-4)
    assert expected_slowest_z(40) == pytest.approx(2.1567, abs=5e-4)
    # grows with the job, ever more slowly
    zs = [expected_slowest_z(n) for n in (2, 8, 64, 512, 4096)]
    assert zs == sorted(zs)
    assert zs[1] - zs[0] > zs[4] - zs[3]
    with pytest.raises(SpecError, match="num_gpus"):
        expected_slowest_z(0)


def test_pace_combines_power_limit_and_slowest_gpu() -> None:
    base = round_profile()
    assert sustained_pace_fraction(base, 4096) == 1.0  # no keys: the burst rate
    assert job_compute_profile(base, 4096) is base
    prof = dataclasses.replace(base, sustained_matmul_fraction=0.9, gpu_matmul_spread_fraction=0.02)
    assert sustained_pace_fraction(prof, 1) == pytest.approx(0.9)
    assert sustained_pace_fraction(prof, 8) == pytest.approx(0.9 * (1 - 0.02 * 1.4338), abs=1e-5)
    job = job_compute_profile(prof, 8)
    factor = sustained_pace_fraction(prof, 8)
    for flops in (1e6, 1e9, 1e13):
        got = job.matmul_flops_per_s("bf16", flops)
        assert got == pytest.approx(factor * prof.matmul_flops_per_s("bf16", flops))
    # memory-bound kernels keep the HBM rate
    assert job.streaming_bytes_per_s() == prof.streaming_bytes_per_s()


def test_fp32_gemms_run_below_the_power_limit_but_wait_for_the_slowest_gpu() -> None:
    """An H100's fp32 GEMM loop (CUDA cores) kept 0.9999 of its burst rate over a 15 s soak,
    bf16 0.896 (benchmarks/gpu_runs/h100-2026-11-27/mechanisms.csv): the power-limit factor
    scales the tensor-core dtypes only; the spread between GPUs scales every dtype."""
    base = load_profile("h100-sxm5-80gb-1gpu")  # measured: has an fp32 GEMM curve
    prof = dataclasses.replace(base, sustained_matmul_fraction=0.9, gpu_matmul_spread_fraction=0.02)
    slowest = 1 - 0.02 * expected_slowest_z(8)
    assert dtype_pace_fraction(prof, 8, "fp32") == pytest.approx(slowest)
    assert dtype_pace_fraction(prof, 8, "bf16") == pytest.approx(0.9 * slowest)
    assert dtype_pace_fraction(prof, 1, "fp32") == 1.0
    job = job_compute_profile(prof, 8)
    for dtype, pace in (("fp32", slowest), ("bf16", 0.9 * slowest)):
        got = job.matmul_flops_per_s(dtype, 1e12)
        assert got == pytest.approx(pace * prof.matmul_flops_per_s(dtype, 1e12))


def test_job_costing_is_the_burst_costing_on_scaled_curves() -> None:
    """Stating the keys gives the same work as pre-scaling the GEMM curves by hand."""
    model = resolve_model("megatron-1.7b")
    plan = plan_from_fields(tp=2, pp=2, dp=2, micro_batch_size=2, global_batch_size=16)
    base = load_profile("h100-sxm5-80gb")
    keyed = dataclasses.replace(base, sustained_matmul_fraction=0.9, gpu_matmul_spread_fraction=0.0)
    by_hand = dataclasses.replace(
        base,
        sustained_matmul_fraction=1.0,
        gpu_matmul_spread_fraction=0.0,
        matmul_efficiency={
            d: dataclasses.replace(c, y=tuple(0.9 * y for y in c.y))
            for d, c in base.matmul_efficiency.items()
        },
    )
    assert build_pipeline_work(model, plan, keyed) == build_pipeline_work(model, plan, by_hand)
    slow, fast = evaluate(model, plan, keyed), evaluate(model, plan, by_hand)
    assert isinstance(slow, Evaluation) and isinstance(fast, Evaluation)
    assert slow.step_time_s == fast.step_time_s


def test_a_larger_job_computes_more_slowly_per_gpu() -> None:
    """Same work per GPU (weak scaling over dp), more GPUs to wait for: the step grows over
    the same plan on GPUs all alike, by more the larger the job; one GPU waits for nobody."""
    model = resolve_model("megatron-1.7b")
    prof = dataclasses.replace(
        load_profile("a100-sxm4-80gb"), overlap_compute_slowdown_fraction=0.0
    )
    alike = dataclasses.replace(prof, gpu_matmul_spread_fraction=0.0)
    excess = []
    for dp in (1, 8, 64):
        plan = plan_from_fields(tp=1, pp=1, dp=dp, micro_batch_size=4, global_batch_size=8 * dp)
        slow, same = evaluate(model, plan, prof), evaluate(model, plan, alike)
        assert isinstance(slow, Evaluation) and isinstance(same, Evaluation)
        excess.append(slow.step_time_s - same.step_time_s)
    assert excess[0] == 0.0
    assert 0.0 < excess[1] < excess[2]


def _dict_with(**values: object) -> dict:  # type: ignore[type-arg]
    data = profile_to_dict(round_profile())
    data.update(values)
    data["provenance"] = {k: "synthetic" for k in profile_dict_provenance_keys(data)}
    return data


def test_profile_keys_round_trip_and_are_checked() -> None:
    profile = profile_from_dict(
        _dict_with(sustained_matmul_fraction=0.95, gpu_matmul_spread_fraction=0.02),
        source="t.yaml",
    )
    assert (profile.sustained_matmul_fraction, profile.gpu_matmul_spread_fraction) == (0.95, 0.02)
    written = profile_to_dict(profile)
    assert (written["sustained_matmul_fraction"], written["gpu_matmul_spread_fraction"]) == (
        0.95,
        0.02,
    )
    # absent: the defaults (1 and 0), and not written back
    plain = profile_to_dict(round_profile())
    assert "sustained_matmul_fraction" not in plain
    assert "gpu_matmul_spread_fraction" not in plain
    with pytest.raises(InputFileError, match=r"t\.yaml.*sustained_matmul_fraction"):
        profile_from_dict(_dict_with(sustained_matmul_fraction=1.2), source="t.yaml")
    with pytest.raises(InputFileError, match=r"t\.yaml.*gpu_matmul_spread_fraction"):
        profile_from_dict(_dict_with(gpu_matmul_spread_fraction=0.5), source="t.yaml")
    with pytest.raises(SpecError, match="sustained_matmul_fraction"):
        dataclasses.replace(round_profile(), sustained_matmul_fraction=0.0)
    with pytest.raises(SpecError, match="gpu_matmul_spread_fraction"):
        dataclasses.replace(round_profile(), gpu_matmul_spread_fraction=-0.01)


def test_shipped_figures_follow_their_cited_measurements() -> None:
    """Recompute each profile's numbers from the figures its provenance cites."""
    z8, z40 = expected_slowest_z(8), expected_slowest_z(40)
    a100 = load_profile("a100-sxm4-80gb")
    # HP10: cuBLAS 8192^3 with randn operands at the 400 W limit, 257 TFLOP/s; MAMF 271.2
    assert a100.sustained_matmul_fraction == pytest.approx(257 / 271.2, abs=5e-4)
    # HP11: 5% across one 8-GPU node = 2 z_8 standard deviations
    assert a100.gpu_matmul_spread_fraction == pytest.approx(0.05 / (2 * z8), abs=5e-5)
    assert load_profile("a100-sxm4-40gb").sustained_matmul_fraction == (
        a100.sustained_matmul_fraction
    )
    # HP11: all 8 GPUs busy, 5 rounds: H200 range 4.5%, B200 range 10.4% over 40 draws
    for name in ("h100-sxm5-80gb", "h200-sxm-141gb"):
        prof = load_profile(name)
        assert prof.gpu_matmul_spread_fraction == pytest.approx(0.045 / (2 * z40), abs=5e-5)
        assert prof.sustained_matmul_fraction == 1.0  # not applied: see hardware_profiles/README
    for name in ("b200-sxm-180gb", "gb200-nvl72", "gb300-nvl72"):
        prof = load_profile(name)
        assert prof.sustained_matmul_fraction == 1.0  # not applied: see hardware_profiles/README
        assert prof.gpu_matmul_spread_fraction == pytest.approx(0.104 / (2 * z40), abs=5e-5)
    assert load_profile("mi300x-192gb").gpu_matmul_spread_fraction == (
        a100.gpu_matmul_spread_fraction
    )
    # a calibrated CPU profile states neither: its runs are single-machine
    cpu = load_profile("cpu-2core-gloo")
    assert (cpu.sustained_matmul_fraction, cpu.gpu_matmul_spread_fraction) == (1.0, 0.0)


def test_simulate_says_at_what_rate_the_job_computes(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "megatron-1.7b", "--gpus", "64", "--tp", "1", "--pp", "1"]
    args += ["--mbs", "1", "--gbs", "64", "--recompute", "full"]
    pace = sustained_pace_fraction(load_profile("a100-sxm4-80gb"), 64)
    assert main([*args, "--gpu", "a100-sxm4-80gb", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["gemm_pace_fraction"] == pace
    assert main([*args, "--gpu", "a100-sxm4-80gb"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    slowest = 1 - 0.0174 * expected_slowest_z(64)
    assert line == (
        f"GEMMs and attention at {100 * pace:.1f}% of a100-sxm4-80gb's burst rate: 94.8% "
        f"sustained at the power limit x {100 * slowest:.1f}% for the slowest of 64 GPUs"
    )
    # a profile without the keys computes at its burst rate and says nothing
    assert main([*args, "--gpu", "mi300x-192gb", "--gpus", "1", "--gbs", "1"]) == 0
    assert "burst rate" not in capsys.readouterr().out


def test_plan_header_says_at_what_rate_the_job_computes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["plan", "--model", "megatron-1.7b", "--gpus", "8", "--gbs", "8", "--top", "1"]
    pace = sustained_pace_fraction(load_profile("a100-sxm4-80gb"), 8)
    assert main([*args, "--gpu", "a100-sxm4-80gb"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith(
        f"; GEMMs at {100 * pace:.1f}% of the burst rate (power limit, slowest of 8 GPUs)"
    )
    assert main([*args, "--gpu", "a100-sxm4-80gb", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["gemm_pace_fraction"] == pace
