"""The pipeline chain items of ``plansim calibrate`` (imports torch; run by ``bench``).

What one action of a ``torch.distributed.pipelining`` schedule costs beyond its stage's ops:
every rank holds one stage, a chain of ``ops`` tiny ops (pairs of ``nn.Linear(8, 8)`` and
GELU, as the host-overhead chains of ``bench_host``), and the schedule runs ``m``
micro-batches of a 2 x 8 input through the ranks in GPipe order. The stages are so small
that the step's time is the chain's ops plus, per action, the schedule's own host work,
posting and waiting for the action's tiny send/recv (64 B of activation or gradient), and
that transfer's latency. ``pipeline_chain_fwd`` runs forward only (torch's
``ScheduleGPipe`` without a loss); ``pipeline_chain_fwd_bwd`` forward and backward through
``_PipelineScheduleRuntime`` on plansim's GPipe action lists, the runtime
``plansim validate`` drives (``plansim.validate.pipeline``). With uniform actions a GPipe
pass over p ranks takes m + p - 1 actions on its critical path, the item's ``work``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from plansim.calibrate.plan import Item
from plansim.schedule.builders import build_actions
from plansim.specs.plan import Schedule
from plansim.specs.stage_placement import StagePlacement

#: Rows and width of one micro-batch of the chain's input.
MICROBATCH_ROWS, WIDTH = 2, 8


def _loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return ((output - target) ** 2).mean()


def plansim_runtime(
    stages: list[Any],
    *,
    schedule: Schedule,
    num_ranks: int,
    num_microbatches: int,
    vpp: int,
    loss_fn: Callable[..., torch.Tensor],
) -> tuple[Any, dict[int, list[Any]]]:
    """torch's ``_PipelineScheduleRuntime`` over ``stages`` running plansim's action lists
    (``plansim.schedule.builders.build_actions``, in torch's ``"0F1"`` alphabet; DualPipeV's
    overlaps as torch's ``OVERLAP_F_B`` actions with their two sub-actions) with send/recv
    lowered by torch, gradients scaled by 1 / m; and those lists per rank as torch
    ``_Action`` s. The runtime ``plansim validate`` drives and this item times.

    The stages get the schedule's stage-to-rank mapping before the lowering, as torch's
    ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV`` set it (:func:`stage_to_rank`)."""
    from torch.distributed.pipelining.schedules import _Action, _PipelineScheduleRuntime

    lists = build_actions(schedule, num_ranks=num_ranks, num_microbatches=num_microbatches, vpp=vpp)
    order = {r: [_Action.from_str(str(a)) for a in acts] for r, acts in enumerate(lists)}
    runtime = _PipelineScheduleRuntime(  # type: ignore[no-untyped-call]
        stages, n_microbatches=num_microbatches, loss_fn=loss_fn, scale_grads=True
    )
    mapping = stage_to_rank(schedule, num_ranks=num_ranks, num_stages=num_ranks * vpp)
    runtime.stage_index_to_group_rank = mapping
    for stage in stages:
        stage.stage_index_to_group_rank = mapping
    runtime.pipeline_order = dict(order)
    runtime._prepare_schedule_with_comms(order)
    return runtime, order


def stage_to_rank(schedule: Schedule, *, num_ranks: int, num_stages: int) -> dict[int, int]:
    """``{stage: pipeline rank}`` of ``schedule``'s placement (torch
    ``generate_stage_to_rank_mapping``, style ``"loop"`` or ``"v"``).

    Raises:
        ValueError: the dual placement (DualPipe), which torch's pipelining does not run.
    """
    from torch.distributed.pipelining._utils import generate_stage_to_rank_mapping

    styles = {StagePlacement.LOOP: "loop", StagePlacement.V: "v"}
    placement = schedule.placement
    if placement not in styles:
        raise ValueError(
            f"schedule {schedule.value}: torch.distributed.pipelining has no "
            f"{placement.value} stage placement (placements: loop, v)"
        )
    return generate_stage_to_rank_mapping(num_ranks, num_stages, style=styles[placement])


def pipeline_chain(item: Item, *, device: torch.device, world: int) -> Callable[[], object]:
    """The call to time for a pipeline chain item: one schedule step on this rank (every
    rank of the world calls it together).

    Raises:
        RuntimeError: the torch build has no ``torch.distributed.pipelining`` (the item is
            then recorded as unsupported).
    """
    try:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
        from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
    except ImportError as exc:
        raise RuntimeError(f"no torch.distributed.pipelining in this torch: {exc}") from None
    ops, m = item.shape
    rank = dist.get_rank()
    chain = torch.nn.Sequential(
        *(
            torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
            for _ in range(ops // 2)
        )
    )
    stage = PipelineStage(chain.to(device), rank, world, device)
    backward = item.op.endswith("_fwd_bwd")
    schedule: ScheduleGPipe | _PipelineScheduleRuntime
    if backward:
        schedule, _ = plansim_runtime(
            [stage], schedule=Schedule.GPIPE, num_ranks=world, num_microbatches=m, vpp=1,
            loss_fn=_loss,
        )  # fmt: skip
    else:
        schedule = ScheduleGPipe(stage, n_microbatches=m, loss_fn=None)
    x = torch.randn(MICROBATCH_ROWS * m, WIDTH, device=device)
    target = torch.zeros(MICROBATCH_ROWS * m, WIDTH, device=device)
    args = (x,) if rank == 0 else ()
    kwargs = {"target": target} if backward and rank == world - 1 else {}
    return lambda: schedule.step(*args, **kwargs)
