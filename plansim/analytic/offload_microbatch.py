"""Offload traffic inside each micro-batch (pure): host accumulation of the gradient shard and
ZeRO-Infinity parameter fetches, added to a stage's actions.

The mechanisms and their sources are in ``plansim.analytic.offload``'s docstring ("Gradient
accumulation through the host", "Parameter offload"); the copies and NVMe transfers are
that module's :func:`~plansim.analytic.offload.host_copy` and
:func:`~plansim.analytic.offload.nvme_transfer` segments, on the same stream and links.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from plansim.analytic.grad_buckets import stage_parameters as stage_param_counts
from plansim.analytic.memory import plan_state_bytes
from plansim.analytic.offload import host_copy, nvme_transfer, require_host
from plansim.analytic.ranks import dp_cp_size
from plansim.specs.hardware import HardwareProfile
from plansim.specs.model import ModelSpec
from plansim.specs.plan import OffloadDevice, ParallelPlan, Schedule
from plansim.specs.work import Segment, StageWork


def accumulates_on_host(plan: ParallelPlan) -> bool:
    """True when the accumulating gradient shard lives in host memory: the optimizer
    offloaded with ZeRO-3, or with ZeRO-2 and more than one micro-batch (module docstring)."""
    if plan.offload_optimizer is OffloadDevice.NONE:
        return False
    return plan.zero_stage == 3 or (plan.zero_stage == 2 and plan.num_microbatches > 1)


def host_accumulation_bytes_per_param(plan: ParallelPlan) -> float:
    """Bytes per parameter of the gradient shard copied each way (device -> host and
    host -> device) per micro-batch to accumulate on the host: one 16-bit copy for ZeRO-3,
    (m - 1) / m of one for ZeRO-2 (the module docstring's average), 0 otherwise."""
    if not accumulates_on_host(plan):
        return 0.0
    copy = plan_state_bytes(plan).param
    if plan.zero_stage == 3:
        return copy
    m = plan.num_microbatches
    return copy * (m - 1) / m


def with_host_grad_accumulation(
    stages: list[StageWork], *, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> list[StageWork]:
    """``stages`` with each micro-batch's host accumulation of the stage's gradient shard
    (``offload_d2h`` then ``offload_h2d``, :func:`host_accumulation_bytes_per_param` x the
    shard) after its reduce-scatter: at the end of the backward, or of the weight-gradient
    pass with a split backward. The same list when nothing accumulates on the host. Stages
    that were one object stay one.
    """
    per_param = host_accumulation_bytes_per_param(plan)
    if per_param == 0.0:
        return stages
    split = plan.schedule is Schedule.ZB_H1

    def accumulate(s: int, st: StageWork) -> StageWork:
        shard = stage_parameters(model, plan, stage=s) / dp_cp_size(plan) * per_param
        copies = (
            host_copy("offload_d2h", shard, profile),
            host_copy("offload_h2d", shard, profile),
        )
        if split:
            return replace(st, backward_weight=st.backward_weight + copies)
        return replace(st, backward=st.backward + copies)

    return _rewrite_stages(stages, accumulate)


def param_fetch_segments(
    model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile, *, stage: int
) -> tuple[Segment, ...]:
    """Segments that bring stage ``stage``'s 16-bit parameter shard to the GPU before one of
    its parameter all-gathers (empty without ``offload_param``): an NVMe read (``nvme``),
    then the host -> device copy. Shard = :func:`stage_parameters` x 2 bytes / (dp * cp).

    Raises:
        SpecError: the profile lacks the host section (or NVMe figures) the plan needs.
    """
    if plan.offload_param is OffloadDevice.NONE:
        return ()
    require_host(plan, profile)
    params = stage_parameters(model, plan, stage=stage)
    shard = params * plan_state_bytes(plan).param / dp_cp_size(plan)
    fetch = host_copy("offload_h2d", shard, profile)
    if plan.offload_param is OffloadDevice.NVME:
        return (nvme_transfer("nvme_read", shard, plan, profile), fetch)
    return (fetch,)


def stage_parameters(model: ModelSpec, plan: ParallelPlan, *, stage: int) -> float:
    """Parameters of model chunk ``stage`` on one TP rank
    (``plansim.analytic.grad_buckets.stage_parameters``, the same sharding rules as
    ``plansim.analytic.memory.rank_parameters``)."""
    return stage_param_counts(model, plan, stage=stage).total


def with_param_fetch(
    stages: list[StageWork], *, model: ModelSpec, plan: ParallelPlan, profile: HardwareProfile
) -> list[StageWork]:
    """``stages`` with :func:`param_fetch_segments` before each forward, backward and
    input-gradient action (where ZeRO-3 gathers the stage's parameters); the same list
    without ``offload_param``. Stages that were one object stay one.

    Raises:
        SpecError: the profile lacks the host section (or NVMe figures) the plan needs.
    """
    if plan.offload_param is OffloadDevice.NONE:
        return stages

    def fetch_first(s: int, st: StageWork) -> StageWork:
        fetch = param_fetch_segments(model, plan, profile, stage=s)
        return replace(
            st,
            forward=fetch + st.forward,
            backward=fetch + st.backward,
            backward_input=fetch + st.backward_input,
        )

    return _rewrite_stages(stages, fetch_first)


def _rewrite_stages(
    stages: list[StageWork], rewrite: Callable[[int, StageWork], StageWork]
) -> list[StageWork]:
    """``rewrite(s, stage)`` of each stage, called once per distinct stage object (with the
    index where it first appears), so stages that were one object stay one."""
    done: dict[int, StageWork] = {}
    out = []
    for s, st in enumerate(stages):
        if id(st) not in done:
            done[id(st)] = rewrite(s, st)
        out.append(done[id(st)])
    return out
