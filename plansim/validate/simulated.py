"""The simulated side of a validation: the plan simulated as torch executes it (pure).

Two differences from ``plansim.planner.evaluate.evaluate``, both to simulate what the
runner executes rather than Megatron-LM: matmuls priced in the run's dtype
(:func:`simulation_profile`; fp32 on the CPU) and asynchronous pipeline sends
(:func:`_with_async_sends`).
"""

from __future__ import annotations

import dataclasses

from plansim.analytic.cost import build_pipeline_work
from plansim.planner.evaluate import Evaluation, Rejected, evaluate
from plansim.schedule.builders import build_actions
from plansim.sim import timeline as tl
from plansim.sim.engine import simulate
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan
from plansim.validate.result import ValidateError


def simulation_profile(profile: HardwareProfile, *, dtype: str, precision: str) -> HardwareProfile:
    """``profile`` with the GEMM peak and efficiency curve of ``dtype`` under ``precision``.

    The simulator prices matmuls in the plan's precision (``bf16``/``fp16``/``fp8``); a run in
    ``fp32`` (the CPU validation default) is priced with the profile's measured fp32 curve
    instead. Unchanged when ``dtype == precision``.

    Raises:
        ValidateError: the profile has no GEMM data for ``dtype``.
    """
    if dtype == precision:
        return profile
    if dtype not in profile.matmul_efficiency:
        raise ValidateError(
            f"profile {profile.name} has no matmul data for the run's dtype {dtype!r}; "
            f"has: {', '.join(profile.dtypes())}"
        )
    return dataclasses.replace(
        profile,
        peak_flops_per_s={**profile.peak_flops_per_s, precision: profile.peak_flops_per_s[dtype]},
        matmul_efficiency={
            **profile.matmul_efficiency,
            precision: profile.matmul_efficiency[dtype],
        },
    )


def simulate_plan(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, dtype: str
) -> Evaluation:
    """The simulated Evaluation of ``plan`` on ``profile`` as the run executed it: matmuls
    in ``dtype`` (:func:`simulation_profile`) and asynchronous pipeline sends
    (:func:`_with_async_sends`).

    Raises:
        ValidateError: the plan is rejected on that profile (the reason is in the message),
            or the profile lacks ``dtype``.
    """
    priced = simulation_profile(profile, dtype=dtype, precision=plan.precision.value)
    outcome = evaluate(model, plan, priced)
    if isinstance(outcome, Rejected):
        raise ValidateError(
            f"cannot simulate {plan.label()} on {profile.name}: {outcome.category}: "
            f"{outcome.reason}"
        )
    if not outcome.result.timeline[tl.STREAM].eq("pp_send").any():
        return outcome
    return _with_async_sends(outcome, model, priced)


def _with_async_sends(ev: Evaluation, model: ModelSpec, profile: HardwareProfile) -> Evaluation:
    """``ev`` re-simulated with asynchronous pipeline sends, as torch runs them.

    ``torch.distributed.pipelining`` posts each send with ``isend`` (``_batch_p2p``) and
    waits for the sends only later in the step, so the sender goes straight on; the
    simulator's default for 1F1B/GPipe is Megatron-LM's synchronous send (the sender waits
    for the transfer). Receives block in both. Figures read from the events are replaced;
    MFU and HFU scale with the step time.
    """
    plan = ev.plan
    work = dataclasses.replace(build_pipeline_work(model, plan, profile), blocking_p2p=False)
    actions = build_actions(
        plan.schedule, num_ranks=plan.pp, num_microbatches=plan.num_microbatches, vpp=plan.vpp
    )
    result = simulate(actions, work)
    ratio = ev.step_time_s / result.step_time_s
    return dataclasses.replace(
        ev,
        step_time_s=result.step_time_s,
        tokens_per_s=ev.tokens_per_s * ratio,
        mfu=ev.mfu * ratio,
        hfu=ev.hfu * ratio,
        bubble_fraction=result.bubble_fraction,
        peak_memory_bytes=max(result.peak_memory_bytes),
        result=result,
        exposed_comm_s_by_kind=dict(result.exposed_s_by_kind),
    )
