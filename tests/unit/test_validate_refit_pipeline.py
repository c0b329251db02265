"""Refit of the per-action pipeline cost (validate/refit_pipeline)."""

from __future__ import annotations

import dataclasses

import pytest

from plansim.specs.compute_terms import HostOverhead
from plansim.specs.plan import plan_from_fields
from plansim.validate.refit import (
    MAX_FACTOR,
    fit_pipeline_actions,
    refit,
    scale_pipeline_actions,
)
from plansim.validate.simulated import simulate_plan
from tests.unit.test_validate_compare import MODEL, measured_run, profile_with_fp32

MS = 1e-3


def _with_actions(forward_s: float, backward_s: float):  # type: ignore[no-untyped-def]
    host = HostOverhead(
        serial=True,
        forward_op_s=0.0,
        backward_op_s=0.0,
        pipeline_action_forward_s=forward_s,
        pipeline_action_backward_s=backward_s,
    )
    profile = profile_with_fp32()
    keys = ("forward_op_us", "backward_op_us", "pipeline_action_forward_us",
            "pipeline_action_backward_us")  # fmt: skip
    provenance = {**profile.provenance, **{f"host_overhead.{k}": "synthetic" for k in keys}}
    provenance["host_overhead.serial"] = "synthetic"
    return dataclasses.replace(profile, host_overhead=host, provenance=provenance)


def test_the_factor_solves_a_linear_step() -> None:
    profile = _with_actions(1 * MS, 2 * MS)

    def step(p):  # type: ignore[no-untyped-def]
        host = p.host_overhead
        return 0.1 + 10 * (host.pipeline_action_forward_s + host.pipeline_action_backward_s)

    # 0.1 + 10 * 3 ms * f = 0.19  ->  f = 3
    assert fit_pipeline_actions(profile, measured_step_s=0.19, simulated_step_s=step) == (
        pytest.approx(3.0, rel=0.01)
    )
    assert fit_pipeline_actions(profile, measured_step_s=0.05, simulated_step_s=step) == 0.0
    assert fit_pipeline_actions(profile, measured_step_s=99.0, simulated_step_s=step) == MAX_FACTOR
    assert (
        fit_pipeline_actions(profile_with_fp32(), measured_step_s=1.0, simulated_step_s=step)
        is None
    )
    scaled = scale_pipeline_actions(profile, 2.0).host_overhead
    assert scaled is not None
    assert (scaled.pipeline_action_forward_s, scaled.pipeline_action_backward_s) == (
        pytest.approx(2 * MS),
        pytest.approx(4 * MS),
    )


def test_refit_recovers_the_per_action_cost_of_a_pipelined_run() -> None:
    """A machine whose pipeline actions cost 3x what the profile says: the refit finds the
    factor from the step time, leaves the passes alone and re-simulates the run exactly."""
    plan = plan_from_fields(dp=1, tp=1, pp=2, micro_batch_size=1, global_batch_size=8)
    profile = _with_actions(2 * MS, 3 * MS)
    truth = simulate_plan(MODEL, plan, _with_actions(6 * MS, 9 * MS), dtype="fp32")
    run = measured_run(truth.result.timeline, step_times_s=(truth.step_time_s,) * 2, plan=plan)
    fitted = refit(run, profile, dtype="fp32", source="test run")
    assert fitted.factors["host_overhead.pipeline_action"] == pytest.approx(3.0, rel=0.02)
    assert fitted.factors.get("gemm_and_launch", 1.0) == pytest.approx(1.0, abs=1e-3)
    assert abs(fitted.after.step_time_error_pct) < 0.5 < abs(fitted.before.step_time_error_pct)
    host = fitted.profile.host_overhead
    assert host is not None and host.pipeline_action_forward_s == pytest.approx(6 * MS, rel=0.02)
    provenance = fitted.profile.provenance["host_overhead.pipeline_action_forward_us"]
    assert provenance.startswith("test run; times x")
