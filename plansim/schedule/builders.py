"""Per-rank action lists for each pipeline schedule (table-driven: Schedule -> builder).

A builder returns, for every pipeline rank, the compute actions it executes in order.
Placement follows Megatron: stage ``s`` lives on rank ``s % num_ranks`` (with vpp = 1,
stage s is rank s). Orders match ``torch.distributed.pipelining``'s ``ScheduleGPipe`` and
``Schedule1F1B`` (their ``_get_pipeline_order`` without the idle steps and REDUCE_GRAD).

To add a schedule (interleaved 1F1B, ZB-H1): write a builder with the :data:`Builder`
signature and register it in ``_BUILDERS``.
"""

from __future__ import annotations

from collections.abc import Callable

from plansim.errors import SpecError, require_positive_int
from plansim.schedule.actions import Action, ActionKind, PerRankActions
from plansim.specs.plan import Schedule

#: (num_ranks, num_microbatches, vpp) -> per-rank actions. Inputs are validated already.
Builder = Callable[[int, int, int], PerRankActions]

_F = ActionKind.FORWARD
_B = ActionKind.FULL_BACKWARD


def _require_vpp_1(schedule: Schedule, vpp: int) -> None:
    if vpp != 1:
        raise SpecError(
            f"schedule {schedule.value!r} with vpp={vpp} is not supported yet: "
            "vpp > 1 needs an interleaved schedule, which is not built yet; use vpp=1"
        )


def _gpipe(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """GPipe (Huang et al. 2019, fill-drain): all forwards of a stage, then all backwards.

    Backwards run in micro-batch order 0..m-1, as torch's ``ScheduleGPipe`` does.
    Stage 0 holds all m micro-batches' activations at the end of the forward phase.
    """
    _require_vpp_1(Schedule.GPIPE, vpp)
    per_rank = []
    for rank in range(num_ranks):
        forwards = [Action(stage=rank, kind=_F, microbatch=j) for j in range(num_microbatches)]
        backwards = [Action(stage=rank, kind=_B, microbatch=j) for j in range(num_microbatches)]
        per_rank.append(tuple(forwards + backwards))
    return tuple(per_rank)


def _one_f_one_b_rank(rank: int, num_ranks: int, num_microbatches: int) -> tuple[Action, ...]:
    """1F1B order of one rank: warm-up forwards, steady F/B pairs, cool-down backwards."""
    warmup = min(num_ranks - rank - 1, num_microbatches)
    actions = [Action(stage=rank, kind=_F, microbatch=j) for j in range(warmup)]
    for j in range(num_microbatches - warmup):
        actions.append(Action(stage=rank, kind=_F, microbatch=warmup + j))
        actions.append(Action(stage=rank, kind=_B, microbatch=j))
    for j in range(num_microbatches - warmup, num_microbatches):
        actions.append(Action(stage=rank, kind=_B, microbatch=j))
    return tuple(actions)


def _one_f_one_b(num_ranks: int, num_microbatches: int, vpp: int) -> PerRankActions:
    """1F1B / PipeDream-Flush (Narayanan et al. SC21 §2.2.1, Fig. 4 top; torch ``Schedule1F1B``).

    Rank r runs ``w = min(p - r - 1, m)`` warm-up forwards, then ``m - w`` pairs
    (forward of micro-batch w + i, backward of micro-batch i), then the ``w`` remaining
    backwards. At most ``min(p - r, m)`` micro-batches are in flight on rank r, so stage 0
    holds ``min(p, m)`` activations instead of GPipe's m. With ``m < p`` it degenerates to
    GPipe on the first ranks (torch's ``Schedule1F1B`` refuses m < p; we allow it).
    """
    _require_vpp_1(Schedule.ONE_F_ONE_B, vpp)
    return tuple(_one_f_one_b_rank(r, num_ranks, num_microbatches) for r in range(num_ranks))


_BUILDERS: dict[Schedule, Builder] = {
    Schedule.GPIPE: _gpipe,
    Schedule.ONE_F_ONE_B: _one_f_one_b,
}


def build_actions(
    schedule: Schedule, *, num_ranks: int, num_microbatches: int, vpp: int = 1
) -> PerRankActions:
    """Per-rank compute actions of ``schedule`` for one pipeline replica and one step.

    Args:
        schedule: the pipeline schedule.
        num_ranks: pipeline-parallel ranks (pp).
        num_microbatches: micro-batches per step (m).
        vpp: model chunks per rank; stages = num_ranks * vpp, stage s on rank s % num_ranks.

    Returns:
        ``actions[rank]``: that rank's actions in execution order.

    Raises:
        SpecError: a count is not a positive integer, or the schedule has no builder for
            this vpp (or at all).
    """
    require_positive_int("num_ranks", num_ranks)
    require_positive_int("num_microbatches", num_microbatches)
    require_positive_int("vpp", vpp)
    builder = _BUILDERS.get(schedule)
    if builder is None:
        known = ", ".join(s.value for s in _BUILDERS)
        raise SpecError(f"schedule {schedule!r} has no action builder yet; built: {known}")
    return builder(num_ranks, num_microbatches, vpp)
