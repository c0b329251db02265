"""Refit of the per-action cost of a pipeline schedule from one measured run (pure; the last
step of ``plansim.validate.refit``).

By the time this runs, the refit has matched the run's forward and backward passes, its
optimizer and its communication. What a pipelined step still gets wrong is then time
between actions: the schedule's own work per action (posting and waiting for each
send/recv, the runtime's bookkeeping; ``host_overhead.pipeline_action_*``,
``plansim.calibrate.bench_pipeline``). One factor f scales both per-action figures, found by
bisection so that the simulated step time equals the measured one (the simulated step never
shortens as f grows: every action's compute only lengthens). f is kept within
[0, :data:`MAX_FACTOR`]; a profile without the figures, or a run without pipelining, is left
as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from plansim.specs.hardware import HardwareProfile
from plansim.validate.compare import simulate_plan
from plansim.validate.result import MeasuredRun

#: Largest factor tried: a per-action cost 20x the calibrated one means the residual is not
#: per-action work.
MAX_FACTOR = 20.0
#: Bisection stops when the simulated step is within this fraction of the measured one.
TOLERANCE = 0.002
_MAX_STEPS = 30


def scale_pipeline_actions(profile: HardwareProfile, factor: float) -> HardwareProfile:
    """``profile`` with both ``pipeline_action_*`` figures x ``factor`` (unchanged without
    them)."""
    host = profile.host_overhead
    if host is None or host.pipeline_action_forward_s is None:
        return profile
    scaled = dataclasses.replace(
        host,
        pipeline_action_forward_s=host.pipeline_action_forward_s * factor,
        pipeline_action_backward_s=(host.pipeline_action_backward_s or 0.0) * factor,
    )
    return dataclasses.replace(profile, host_overhead=scaled)


def fit_pipeline_actions(
    profile: HardwareProfile,
    *,
    measured_step_s: float,
    simulated_step_s: Callable[[HardwareProfile], float],
) -> float | None:
    """The factor on ``profile``'s per-action figures that makes ``simulated_step_s`` equal
    ``measured_step_s`` (module docstring), or None when the profile has no such figures or
    the measured step is not positive. Clipped to 0 when even no per-action cost simulates
    too long a step, to :data:`MAX_FACTOR` when the largest does not reach it."""
    host = profile.host_overhead
    if host is None or host.pipeline_action_forward_s is None or not measured_step_s > 0:
        return None

    def error(factor: float) -> float:
        return simulated_step_s(scale_pipeline_actions(profile, factor)) / measured_step_s - 1

    if error(0.0) >= 0:
        return 0.0
    if error(MAX_FACTOR) <= 0:
        return MAX_FACTOR
    low, high = 0.0, MAX_FACTOR
    mid = 1.0
    for _ in range(_MAX_STEPS):
        e = error(mid)
        if abs(e) < TOLERANCE:
            break
        low, high = (mid, high) if e < 0 else (low, mid)
        mid = (low + high) / 2
    return mid


def refit_pipeline(
    run: MeasuredRun,
    profile: HardwareProfile,
    *,
    dtype: str,
    factors: dict[str, float],
    notes: list[str],
) -> HardwareProfile:
    """``profile`` with its per-action figures refitted to ``run`` (:func:`fit_pipeline_actions`
    on the run's median step), the factor in ``factors["host_overhead.pipeline_action"]``
    and a line in ``notes`` when the profile has no figures or the factor was clipped."""
    factor = fit_pipeline_actions(
        profile,
        measured_step_s=run.median_step_time_s,
        simulated_step_s=lambda p: simulate_plan(run.model, run.plan, p, dtype=dtype).step_time_s,
    )
    if factor is None:
        notes.append("pipeline_action: the profile has no per-action figures; kept")
        return profile
    factors["host_overhead.pipeline_action"] = factor
    if factor in (0.0, MAX_FACTOR):
        notes.append(
            f"pipeline_action: clipped at x{factor:g}; the step's error is not per-action work"
        )
    return scale_pipeline_actions(profile, factor)
