"""The simulated side of a validation: the plan simulated as torch executes it (pure).

Two differences from ``plansim.planner.evaluate.evaluate``'s Megatron-LM defaults, both to
simulate what the runner executes: the plan's precision is the run's dtype
(:func:`run_plan`; fp32 on the CPU: fp32 GEMM curve, 4-byte weights, gradients,
activations and messages, torch AdamW's 28 B/param step; ``plansim.specs.plan.Precision``)
and pipeline sends are asynchronous (:func:`_with_async_sends`).
"""

from __future__ import annotations

import dataclasses

from plansim.analytic.cost import build_pipeline_work
from plansim.errors import choice_error
from plansim.planner.evaluate import Evaluation, Rejected, evaluate
from plansim.schedule.builders import build_actions
from plansim.sim import timeline as tl
from plansim.sim.engine import simulate
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import ParallelPlan, Precision
from plansim.validate.result import ValidateError


def run_plan(plan: ParallelPlan, profile: HardwareProfile, *, dtype: str) -> ParallelPlan:
    """``plan`` with the precision the run executes in: ``dtype`` (``fp32`` on the CPU).

    Raises:
        ValidateError: ``dtype`` is not a precision plansim models, or ``profile`` has no
            GEMM data for it (a profile needs ``matmul_efficiency.<dtype>`` to price the run;
            ``plansim calibrate`` measures fp32, bf16 and fp16).
    """
    allowed = [p.value for p in Precision]
    if dtype not in allowed:
        raise ValidateError(str(choice_error("dtype", dtype, allowed)))
    precision = Precision(dtype)
    if dtype not in profile.matmul_efficiency:
        raise ValidateError(
            f"profile {profile.name} has no matmul data for the run's dtype {dtype!r}; "
            f"has: {', '.join(profile.dtypes())}"
        )
    return plan if plan.precision is precision else dataclasses.replace(plan, precision=precision)


def simulation_profile(profile: HardwareProfile, *, dtype: str, precision: str) -> HardwareProfile:
    """``profile`` with ``dtype``'s GEMM peak and curve under the name ``precision``.

    Kept for callers that price a run in one dtype under another precision's name; the
    validator itself simulates the run's own precision (:func:`run_plan`). Unchanged when
    ``dtype == precision``.

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
    """The simulated Evaluation of ``plan`` on ``profile`` as the run executed it: in the
    run's precision ``dtype`` (:func:`run_plan`) and with asynchronous pipeline sends
    (:func:`_with_async_sends`).

    Raises:
        ValidateError: the plan is rejected on that profile (the reason is in the message),
            or the profile lacks ``dtype``.
    """
    executed = run_plan(plan, profile, dtype=dtype)
    outcome = evaluate(model, executed, profile)
    if isinstance(outcome, Rejected):
        raise ValidateError(
            f"cannot simulate {plan.label()} in {dtype} on {profile.name}: "
            f"{outcome.category}: {outcome.reason}"
        )
    if not outcome.result.timeline[tl.STREAM].eq("pp_send").any():
        return outcome
    return _with_async_sends(outcome, model, profile)


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
