"""A step of many micro-batches from two shorter simulations (plansim.sim.steady_state): the
sizes, and every figure against the whole simulation."""

from __future__ import annotations

import pytest

from plansim.catalog import resolve_model
from plansim.cli import main
from plansim.io.profiles import load_profile
from plansim.planner.evaluate import Evaluation, evaluate
from plansim.sim.steady_state import MIN_WINDOWS, steady_state_sizes
from plansim.specs.plan import Recompute, Schedule, plan_from_fields

MODEL = resolve_model("megatron-1.7b")
PROFILE = load_profile("a100-sxm4-80gb")


@pytest.mark.parametrize("pp", [1, 3, 4, 16])
@pytest.mark.parametrize("schedule", [Schedule.ONE_F_ONE_B, Schedule.ZB_H1])
def test_the_two_simulations_cover_the_step_in_whole_windows(pp: int, schedule: Schedule) -> None:
    for m in range(1, 2000, 7):
        sizes = steady_state_sizes(m, pp=pp, schedule=schedule)
        if sizes is None:
            window = max(8 * pp, 64)
            assert m <= MIN_WINDOWS * (-(-window // pp) * pp)
            continue
        w = sizes.window
        assert w % pp == 0 and w >= 8 * pp and w >= 64
        assert w <= sizes.short < 2 * w and sizes.short % w == m % w
        assert sizes.long == sizes.short + w and sizes.long + sizes.repeats * w == m
        assert sizes.repeats >= MIN_WINDOWS - 2
    assert steady_state_sizes(10**6, pp=4, schedule=Schedule.GPIPE) is None  # not affine


PLANS = {
    "1f1b": plan_from_fields(dp=1, tp=2, pp=4, micro_batch_size=1, global_batch_size=300),
    "interleaved, overlapped p2p": plan_from_fields(
        dp=1, tp=2, pp=4, vpp=3, micro_batch_size=1, global_batch_size=300,
        schedule=Schedule.INTERLEAVED_1F1B, overlap_p2p_comm=True,
    ),
    "zb-h1": plan_from_fields(
        dp=1, tp=2, pp=4, micro_batch_size=1, global_batch_size=300, schedule=Schedule.ZB_H1
    ),
    "zero1 buckets": plan_from_fields(
        dp=2, tp=2, pp=4, micro_batch_size=1, global_batch_size=600, zero_stage=1,
        overlap_grad_reduce=True, recompute=Recompute.FULL,
    ),
    "zero3, no pipeline": plan_from_fields(
        dp=8, tp=1, pp=1, micro_batch_size=1, global_batch_size=8 * 300, zero_stage=3
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(PLANS))
def test_the_extrapolated_step_equals_the_whole_one(name: str) -> None:
    plan = PLANS[name]
    assert steady_state_sizes(plan.num_microbatches, pp=plan.pp, schedule=plan.schedule)
    fast, whole = evaluate(MODEL, plan, PROFILE), evaluate(MODEL, plan, PROFILE, whole=True)
    assert isinstance(fast, Evaluation) and isinstance(whole, Evaluation)
    assert whole.result.simulated_microbatches == plan.num_microbatches
    assert fast.result.simulated_microbatches < plan.num_microbatches
    got, want = fast.result, whole.result
    close = pytest.approx
    assert fast.step_time_s == close(whole.step_time_s, rel=1e-12)
    assert got.pipeline_time_s == close(want.pipeline_time_s, rel=1e-12)
    assert got.per_rank_bubble_fraction == close(want.per_rank_bubble_fraction, rel=1e-9)
    assert got.bubble_fraction == close(want.bubble_fraction, rel=1e-9)
    assert got.peak_memory_bytes == close(want.peak_memory_bytes, rel=1e-12)
    assert got.busy_s_by_kind == close(want.busy_s_by_kind, rel=1e-10)
    assert got.exposed_s_by_kind == close(want.exposed_s_by_kind, rel=1e-9, abs=1e-12)
    assert got.compute_busy_s == close(want.compute_busy_s, rel=1e-12)
    assert got.num_events == want.num_events
    assert (fast.mfu, fast.tokens_per_s) == (close(whole.mfu), close(whole.tokens_per_s))


def test_gpipe_is_simulated_whole() -> None:
    plan = plan_from_fields(
        dp=1,
        tp=2,
        pp=4,
        micro_batch_size=1,
        global_batch_size=300,
        schedule=Schedule.GPIPE,
        recompute=Recompute.FULL,
    )
    got = evaluate(MODEL, plan, PROFILE)
    assert isinstance(got, Evaluation) and got.result.simulated_microbatches == 300


def test_plansim_simulate_keeps_every_micro_batch_in_its_trace_with_whole_step(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The trace of a long step is the steady-state window (the longer of the two shorter
    simulations, 172 of 300 micro-batches here) unless ``--whole-step`` asks for all."""
    import json

    trace = tmp_path / "t.json"
    argv = ["simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
    argv += ["--tp", "2", "--pp", "4", "--mbs", "1", "--gbs", "300", "--trace", str(trace)]

    def forwards() -> set[int]:
        events = json.loads(trace.read_text())["traceEvents"]
        return {e["args"]["microbatch"] for e in events if e.get("name", "").startswith("F")}

    assert main(argv) == 0
    assert forwards() == set(range(172))
    assert main([*argv, "--whole-step"]) == 0
    assert forwards() == set(range(300))


def test_plansim_simulate_says_when_its_figures_are_extrapolated(capsys) -> None:  # type: ignore[no-untyped-def]
    """Without a trace or plot the step comes from the steady state, and the report says so;
    the figures equal the whole simulation's (the JSON step time to 1e-12)."""
    import json

    argv = ["simulate", "--model", "megatron-1.7b", "--gpu", "a100-sxm4-80gb", "--gpus", "8"]
    argv += ["--tp", "2", "--pp", "4", "--mbs", "1", "--gbs", "300"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "300 micro-batches per pipeline, extrapolated from simulations of 108 and 172" in text
    assert main([*argv, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulated_microbatches"] == 172
    whole = evaluate(MODEL, PLANS["1f1b"], PROFILE, whole=True)
    assert isinstance(whole, Evaluation)
    assert doc["step_time_s"] == pytest.approx(whole.step_time_s, rel=1e-12)
    # a run that simulates every micro-batch says nothing
    assert main(["simulate", *argv[1:-2], "--gbs", "200"]) == 0
    assert "extrapolated" not in capsys.readouterr().out
