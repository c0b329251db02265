"""Comparison of a measured run with its simulation, and the profile refit (pure, no torch).

The measured runs are synthetic: the simulated Timeline of the same plan with each kind's
durations scaled by a known factor, so every expected error is worked out from the factors.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import pytest

from plansim.errors import InputFileError
from plansim.io.profiles import SCALAR_KEYS, load_profile, write_profile
from plansim.sim import timeline as tl
from plansim.specs.curves import COLLECTIVES, CollectiveCurve, Curve
from plansim.specs.hardware import HardwareProfile
from plansim.specs.plan import ParallelPlan, Schedule, plan_from_fields
from plansim.validate.compare import (
    compare,
    error_pct,
    median_step_index,
    simulate_plan,
    simulation_profile,
)
from plansim.validate.refit import refit, waited_transfers_s
from plansim.validate.result import MeasuredRun, ValidateError
from tests.unit.synthetic import TINY_MODEL, round_profile

MODEL = TINY_MODEL
PLAN = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=4)


def profile_with_fp32() -> HardwareProfile:
    """The round-number profile plus a slow fp32 GEMM curve (50 GFLOP/s peak: compute-bound
    for the tiny model) and a 1 GiB reserve, with a source for every number (so that it
    writes and reads back)."""
    base = round_profile(gpus_per_node=2)
    peaks = {**base.peak_flops_per_s, "fp32": 50e9}
    curves = {**base.matmul_efficiency, "fp32": Curve(x=(1.0, 1e12), y=(0.5, 1.0))}
    keys = [*SCALAR_KEYS.values(), "gpus_per_node"]
    keys += [f"peak_tflops.{d}" for d in peaks] + [f"matmul_efficiency.{d}" for d in curves]
    keys += [f"intra_node.{c}{suffix}" for c in COLLECTIVES for suffix in ("", ".latency_us")]
    return dataclasses.replace(
        base,
        peak_flops_per_s=peaks,
        matmul_efficiency=curves,
        memory_reserve_bytes=float(2**30),
        provenance={k: "synthetic" for k in keys},
    )


def scaled(df: pd.DataFrame, factors: Mapping[str, float], *, time: float) -> pd.DataFrame:
    """``df`` with start times x ``time`` and each kind's durations x its factor (default 1)."""
    duration = (df[tl.END_S] - df[tl.START_S]) * df[tl.KIND].map(lambda k: factors.get(k, 1.0))
    out = df.copy()
    out[tl.START_S] = df[tl.START_S] * time
    out[tl.END_S] = out[tl.START_S] + duration
    return out


def measured_run(
    timeline: pd.DataFrame,
    *,
    step_times_s: tuple[float, ...],
    plan: ParallelPlan = PLAN,
    memory: tuple[int, ...] = (1000, 2000),
) -> MeasuredRun:
    return MeasuredRun(
        model=MODEL,
        plan=plan,
        backend="gloo",
        device="cpu",
        num_processes=plan.num_gpus,
        num_warmup_steps=1,
        step_times_s=step_times_s,
        losses=(5.0, 4.9, 4.8, 4.7),
        timelines=tuple(timeline for _ in step_times_s),
        peak_memory_bytes=memory,
        versions={"torch": "test", "python": "3"},
    )


@pytest.fixture(scope="module")
def simulated():  # type: ignore[no-untyped-def]
    return simulate_plan(MODEL, PLAN, profile_with_fp32(), dtype="fp32")


def test_error_pct_is_signed_simulated_against_measured() -> None:
    assert error_pct(1.5, 1.0) == pytest.approx(50.0)
    assert error_pct(0.5, 1.0) == pytest.approx(-50.0)
    assert error_pct(1.0, 0.0) is None


def test_simulation_profile_prices_the_run_dtype() -> None:
    profile = profile_with_fp32()
    priced = simulation_profile(profile, dtype="fp32", precision="bf16")
    assert priced.peak_flops_per_s["bf16"] == 50e9
    assert priced.matmul_efficiency["bf16"] is profile.matmul_efficiency["fp32"]
    assert simulation_profile(profile, dtype="bf16", precision="bf16") is profile
    with pytest.raises(ValidateError, match="no matmul data for the run's dtype 'fp8'"):
        simulation_profile(profile, dtype="fp8", precision="bf16")
    # fp32 GEMMs are priced on the slow fp32 curve
    fp32 = simulate_plan(MODEL, PLAN, profile, dtype="fp32").step_time_s
    bf16 = simulate_plan(MODEL, PLAN, profile, dtype="bf16").step_time_s
    assert fp32 > bf16


def test_identical_measurement_has_zero_errors(simulated) -> None:  # type: ignore[no-untyped-def]
    sim = simulated.result.timeline
    run = measured_run(sim, step_times_s=(simulated.step_time_s,) * 3)
    c = compare(run, simulated)
    doc = c.to_dict()
    assert doc["step_time_error_pct"] == 0.0
    assert all(v["error_pct"] in (0.0, None) for v in doc["categories_s"].values())
    assert (
        doc["bubble_fraction"]["measured_per_rank"] == doc["bubble_fraction"]["simulated_per_rank"]
    )
    assert doc["bubble_fraction"]["measured"] > 0.1  # pp2 with 4 micro-batches has a bubble
    events = doc["events"]
    assert events["num_matched"] == len(sim[(sim.stage >= 0) & (sim.microbatch >= 0)])
    assert events["num_measured_only"] == events["num_simulated_only"] == 0
    assert events["duration_abs_error_pct_max"] == 0.0


def test_errors_per_kind_follow_the_scaling(simulated) -> None:  # type: ignore[no-untyped-def]
    sim = simulated.result.timeline
    meas = scaled(sim, {"forward": 2.0, "backward": 1.25}, time=1.0)
    # median of 3 steps: the middle one, 2 x simulated
    step = simulated.step_time_s
    run = measured_run(meas, step_times_s=(3 * step, 2 * step, 1 * step))
    doc = compare(run, simulated).to_dict()
    assert doc["measured_step_time_s"] == pytest.approx(2 * step)
    assert doc["step_time_error_pct"] == pytest.approx(-50.0)
    kinds = doc["kinds"]
    assert kinds["forward"]["mean_error_pct"] == pytest.approx(-50.0)
    assert kinds["backward"]["total_error_pct"] == pytest.approx(-20.0)
    assert kinds["optimizer"]["mean_error_pct"] == pytest.approx(0.0, abs=1e-6)
    assert doc["categories_s"]["forward"]["error_pct"] == pytest.approx(-50.0)
    assert kinds["forward"]["measured_count"] == kinds["forward"]["simulated_count"] == 8
    assert doc["events"]["duration_error_pct_median"] < 0
    # memory per pipeline rank, signed; the simulated side without the 1 GiB reserve
    model_bytes = simulated.result.peak_memory_bytes[0] - 2**30
    assert 0 < model_bytes < 2**30
    assert doc["peak_memory_bytes"]["error_pct_per_rank"][0] == pytest.approx(
        100 * (model_bytes - 1000) / 1000, rel=1e-6
    )


def test_bubble_is_read_from_the_measured_events(simulated) -> None:  # type: ignore[no-untyped-def]
    sim = simulated.result.timeline
    # forward twice as long on measured side at the same start times: less idle time
    meas = scaled(sim, {}, time=2.0)  # same durations, gaps doubled: more idle time
    run = measured_run(meas, step_times_s=(2 * simulated.step_time_s,))
    doc = compare(run, simulated).to_dict()
    bubble = doc["bubble_fraction"]
    assert bubble["measured"] > bubble["simulated"]
    assert bubble["difference"] == pytest.approx(bubble["simulated"] - bubble["measured"])
    pipeline_end = float(tl.pipeline_work(meas)[tl.END_S].max())
    expected = tl.bubble_fractions(meas, num_ranks=2, pipeline_time_s=pipeline_end)
    assert bubble["measured_per_rank"] == pytest.approx(list(expected), rel=1e-8)


def test_unmatched_events_are_counted(simulated) -> None:  # type: ignore[no-untyped-def]
    sim = simulated.result.timeline
    forward = sim[sim[tl.KIND] == "forward"].index[0]
    extra = tl.make_timeline(
        [
            (0, "compute", "forward", 0, 99, 0.0, 1e-6, 0.0),
            *sim.drop(index=forward).itertuples(index=False, name=None),
        ]
    )
    run = measured_run(extra, step_times_s=(simulated.step_time_s,))
    events = compare(run, simulated).to_dict()["events"]
    assert events["num_simulated_only"] == 1
    assert events["num_measured_only"] == 1


def test_comparison_json_is_deterministic_and_names_the_run(simulated) -> None:  # type: ignore[no-untyped-def]
    meas = scaled(simulated.result.timeline, {"forward": 1.1}, time=1.05)
    run = measured_run(meas, step_times_s=(0.3, 0.1, 0.2))
    first = json.dumps(compare(run, simulated).to_dict(), sort_keys=True)
    second = json.dumps(compare(run, simulated).to_dict(), sort_keys=True)
    assert first == second
    doc = json.loads(first)
    for key in ("measured_step_time_s", "simulated_step_time_s", "step_time_error_pct", "model"):
        assert key in doc
    assert doc["model"]["num_layers"] == 4 and doc["model"]["activation"] == "gelu"
    assert doc["run"]["plan"]["label"] == PLAN.label()
    assert doc["run"]["num_measured_steps"] == 3 and doc["run"]["backend"] == "gloo"
    assert set(doc["categories_s"]) == {
        "forward",
        "backward",
        "optimizer",
        "communication",
        "exposed_communication",
        "bubble",
    }


def test_compare_rejects_bad_measured_timelines(simulated) -> None:  # type: ignore[no-untyped-def]
    sim = simulated.result.timeline
    wrong_rank = sim.assign(rank=sim[tl.RANK] + 1)
    with pytest.raises(ValidateError, match="has rank 2; the plan has 2 pipeline ranks"):
        compare(measured_run(wrong_rank, step_times_s=(1.0,)), simulated)
    with pytest.raises(ValidateError, match="measured timeline of step 0"):
        compare(measured_run(sim.drop(columns=["bytes"]), step_times_s=(1.0,)), simulated)


def slower(profile: HardwareProfile) -> HardwareProfile:
    """The 'true' machine of the refit tests: fp32 GEMMs 3x, streaming 2x and pipeline
    transfers 1.5x slower than ``profile`` says."""
    fp32 = profile.matmul_efficiency["fp32"]
    old = profile.intra_node["sendrecv"]
    bw = old.busbw_bytes_per_s
    sendrecv = CollectiveCurve(
        collective="sendrecv",
        latency_s=1.5 * old.latency_s,
        busbw_bytes_per_s=Curve(x=bw.x, y=tuple(y / 1.5 for y in bw.y)),
    )
    return dataclasses.replace(
        profile,
        matmul_efficiency={
            **profile.matmul_efficiency,
            "fp32": Curve(x=fp32.x, y=(0.5 / 3, 1 / 3)),
        },
        hbm_efficiency_fraction=profile.hbm_efficiency_fraction / 2,
        intra_node={**profile.intra_node, "sendrecv": sendrecv},
    )


def test_waited_transfers_read_the_pipeline_transfer_time() -> None:
    ev = simulate_plan(MODEL, PLAN, profile_with_fp32(), dtype="fp32")
    transfers = waited_transfers_s(ev.result.timeline)
    p2p = ev.result.timeline[ev.result.timeline[tl.STREAM] == "pp_send"]
    assert transfers  # rank 1 waits for its first forward input, rank 0 for gradients
    assert transfers == pytest.approx(
        [float((p2p[tl.END_S] - p2p[tl.START_S]).iloc[0])] * len(transfers)
    )


def test_refit_recovers_the_true_machine() -> None:
    profile = profile_with_fp32()
    truth = simulate_plan(MODEL, PLAN, slower(profile), dtype="fp32")
    run = measured_run(truth.result.timeline, step_times_s=(truth.step_time_s,) * 2)
    fitted = refit(run, profile, dtype="fp32", source="test run")
    before = fitted.before.to_dict()["categories_s"]
    after = fitted.after.to_dict()["categories_s"]
    for name in ("forward", "backward", "optimizer", "communication"):
        assert abs(after[name]["error_pct"]) < 0.5 < abs(before[name]["error_pct"]), name
    assert abs(fitted.after.step_time_error_pct) < 0.5 < abs(fitted.before.step_time_error_pct)
    assert fitted.factors["streaming"] == pytest.approx(2.0)
    assert fitted.factors["gemm_and_launch"] == pytest.approx(3.0, rel=0.01)
    assert fitted.factors["intra_node.sendrecv"] == pytest.approx(1.5)
    new = fitted.profile
    # refitted: fp32 GEMMs, launch, streaming, sendrecv; everything else kept
    assert new.matmul_efficiency["fp32"] != profile.matmul_efficiency["fp32"]
    assert new.matmul_efficiency["bf16"] == profile.matmul_efficiency["bf16"]
    assert new.intra_node["all_gather"] == profile.intra_node["all_gather"]
    assert new.intra_node["sendrecv"].latency_s == pytest.approx(1.5 * 10e-6)
    assert new.nic_bytes_per_s == profile.nic_bytes_per_s
    assert new.provenance["nic_gb_per_s"] == "synthetic"
    assert new.provenance["matmul_efficiency.fp32"].startswith("test run; times x")
    assert new.provenance["intra_node.sendrecv.latency_us"].startswith("test run")
    assert not any("not observed" in n for n in fitted.notes)  # tp1 dp1: nothing to observe


def test_refitted_profile_writes_atomically(tmp_path: Path) -> None:
    profile = profile_with_fp32()
    ev = simulate_plan(MODEL, PLAN, profile, dtype="fp32")
    run = measured_run(
        scaled(ev.result.timeline, {"optimizer": 2.0}, time=1.0), step_times_s=(1.0,)
    )
    fitted = refit(run, profile, dtype="fp32", source="test run").profile
    path = tmp_path / "p.yaml"
    write_profile(profile, path)
    old = path.read_bytes()
    broken = dataclasses.replace(fitted, provenance={})  # cannot load back: never written
    with pytest.raises(InputFileError):
        write_profile(broken, path)
    assert path.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]
    write_profile(fitted, path)
    assert load_profile(str(path)).hbm_efficiency_fraction == pytest.approx(0.5)


def test_interleaved_plan_compares_per_virtual_stage() -> None:
    plan = plan_from_fields(
        dp=1,
        tp=1,
        pp=2,
        vpp=2,
        micro_batch_size=1,
        global_batch_size=4,
        schedule=Schedule.INTERLEAVED_1F1B,
    )
    ev = simulate_plan(MODEL, plan, profile_with_fp32(), dtype="fp32")
    run = measured_run(ev.result.timeline, step_times_s=(ev.step_time_s,), plan=plan)
    doc = compare(run, ev).to_dict()
    assert doc["events"]["num_matched"] > 0 and doc["events"]["num_simulated_only"] == 0
    assert sorted(set(ev.result.timeline[tl.STAGE])) == [-1, 0, 1, 2, 3]


def test_representative_step_is_the_median_one(simulated) -> None:  # type: ignore[no-untyped-def]
    sim = simulated.result.timeline
    slow = scaled(sim, {"forward": 3.0}, time=1.0)
    run = dataclasses.replace(
        measured_run(sim, step_times_s=(5.0, 1.0, 2.0, 9.0)), timelines=(slow, slow, sim, slow)
    )
    assert median_step_index(run) == 2  # times 1, 2, 5, 9: the faster middle one is 2.0 s
    c = compare(run, simulated)
    # totals of the representative step (unscaled), mean durations over every step
    assert c.categories["forward"][0] == pytest.approx(c.categories["forward"][1])
    assert c.kinds.loc["forward", "measured_mean_s"] == pytest.approx(
        2.5 * c.kinds.loc["forward", "simulated_mean_s"]
    )
    assert c.to_dict()["run"]["representative_step"] == 2


def test_disturbed_steps_follow_the_calibration_cpu_share_rule() -> None:
    timeline = pd.DataFrame(
        columns=["rank", "stream", "kind", "stage", "microbatch", "start_s", "end_s", "bytes"]
    )
    run = measured_run(timeline, step_times_s=(1.0, 1.2, 1.0))
    assert run.disturbed_steps == ()  # nothing recorded (GPU, or no schedstat)
    waits = dataclasses.replace(run, run_queue_fractions=(0.03, 0.38, 0.1))
    assert waits.disturbed_steps == (1,)  # 10% is quiet: the calibration keeps >= 90%
    with pytest.raises(ValidateError, match="3 measured steps"):
        dataclasses.replace(run, run_queue_fractions=(0.03,))


def test_refit_of_zero1_fits_the_collectives_the_runner_uses() -> None:
    """dp2 ZeRO-1 runs a flat all-reduce and per-tensor broadcasts (``executed_dp``): a
    machine whose all-reduce and send/recv are 2x slower is recovered on those two curves,
    and the reduce-scatter / all-gather curves the runner never uses are kept."""
    profile = profile_with_fp32()
    plan = plan_from_fields(dp=2, tp=1, pp=1, micro_batch_size=1, global_batch_size=4, zero_stage=1)

    def twice(curve: CollectiveCurve) -> CollectiveCurve:
        bw = curve.busbw_bytes_per_s
        return dataclasses.replace(
            curve,
            latency_s=2 * curve.latency_s,
            busbw_bytes_per_s=Curve(x=bw.x, y=tuple(y / 2 for y in bw.y)),
        )

    slow = {c: twice(profile.intra_node[c]) for c in ("all_reduce", "sendrecv")}
    truth_profile = dataclasses.replace(profile, intra_node={**profile.intra_node, **slow})
    truth = simulate_plan(MODEL, plan, truth_profile, dtype="fp32")
    run = measured_run(
        truth.result.timeline, step_times_s=(truth.step_time_s,) * 2, plan=plan, memory=(1000,)
    )
    fitted = refit(run, profile, dtype="fp32", source="test run")
    assert abs(fitted.after.step_time_error_pct) < 0.5 < abs(fitted.before.step_time_error_pct)
    assert fitted.factors["intra_node.all_reduce"] == pytest.approx(2.0, rel=0.05)
    assert fitted.factors["intra_node.sendrecv"] == pytest.approx(2.0, rel=0.05)
    for kept in ("all_gather", "reduce_scatter"):
        assert fitted.profile.intra_node[kept] == profile.intra_node[kept]
