"""Invariant checks of per-rank action lists, with torch-style timestep x rank grids.

Rules (as torch's ``_validate_schedule`` and ``_add_send_recv`` apply them):

- every (stage, micro-batch) has exactly one F, and either one B or one I plus one W (with
  the dual placement, only the micro-batches of the stage's copy);
- each action runs on the rank holding its stage (``stage % num_ranks``, or the V / dual
  placement's rank, ``plansim.specs.stage_placement``); an overlapped F&B item counts as its
  two actions, forward first;
- on that rank, F comes before its B/I, and I before its W;
- the lists execute without deadlock: F(s, j) needs the activation of F(s-1, j), and B(s, j)
  or I(s, j) needs the input gradient of B/I(s+1, j) (previous and next along the
  micro-batch's path: :class:`plansim.specs.stage_placement.StageGraph`); an overlapped item
  waits for both its inputs. The same-rank dependencies (F before B/I, I before W) follow
  from the list order checked above.

Violations raise :class:`ScheduleError` whose message names the offending action and shows
the grid (like torch's ``_format_pipeline_order``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import NoReturn

from plansim.errors import SpecError
from plansim.schedule.actions import (
    Action,
    ActionKind,
    Grid,
    PerRankActions,
    ScheduleItem,
    format_grid,
    parts,
)
from plansim.specs.stage_placement import StageGraph, StagePlacement

_F = ActionKind.FORWARD
_B = ActionKind.FULL_BACKWARD
_I = ActionKind.BACKWARD_INPUT
_W = ActionKind.BACKWARD_WEIGHT
#: The same-rank action that must come earlier in the list: F before B/I, I before W.
_PREREQUISITE = {_B: _F, _I: _F, _W: _I}


class ScheduleError(SpecError):
    """Per-rank action lists break an invariant or deadlock; the message holds the grid."""


class Signal(str, enum.Enum):
    """What a finished action hands to a neighbouring stage."""

    ACTIVATION = "activation"  # output of F(s, j), input of F(s+1, j)
    INPUT_GRAD = "input_grad"  # output of B/I(s, j), input of B/I(s-1, j)


#: (signal, producing stage, micro-batch).
SignalKey = tuple[Signal, int, int]


def needs(action: Action, *, num_stages: int, graph: StageGraph | None = None) -> SignalKey | None:
    """The cross-stage input ``action`` waits for, or None (first F, last B/I, any W).

    ``graph`` gives the micro-batch's path; None: stages 0 .. num_stages - 1 in order."""
    if action.kind is _F:
        before = (
            graph.previous_stage(action.stage)
            if graph is not None
            else (action.stage - 1 if action.stage > 0 else None)
        )
        return None if before is None else (Signal.ACTIVATION, before, action.microbatch)
    if action.kind is _W:
        return None
    after = (
        graph.next_stage(action.stage)
        if graph is not None
        else (action.stage + 1 if action.stage < num_stages - 1 else None)
    )
    return None if after is None else (Signal.INPUT_GRAD, after, action.microbatch)


def item_needs(
    item: ScheduleItem, *, num_stages: int, graph: StageGraph | None = None
) -> tuple[SignalKey, ...]:
    """Every cross-stage input a list item waits for (an overlap waits for both)."""
    keys = (needs(a, num_stages=num_stages, graph=graph) for a in parts(item))
    return tuple(key for key in keys if key is not None)


def provides(action: Action) -> SignalKey | None:
    """The signal ``action`` produces when it ends (W produces none)."""
    if action.kind is _F:
        return (Signal.ACTIVATION, action.stage, action.microbatch)
    if action.kind is _W:
        return None
    return (Signal.INPUT_GRAD, action.stage, action.microbatch)


def _fail(
    message: str, grid: Grid, *, step: int | None = None, rank: int | None = None
) -> NoReturn:
    flagged = [(rank, step)] if rank is not None and step is not None else []
    table = format_grid(grid, error_step=step, flagged=flagged)
    raise ScheduleError(f"{message}\n\nPipeline schedule (timestep x rank):\n{table}")


def _check_placement(
    actions: PerRankActions, *, graph: StageGraph
) -> dict[tuple[int, ActionKind, int], tuple[int, int]]:
    """Check ranges, placement, duplicates and same-rank order; return (rank, step) by action."""
    num_stages, num_microbatches = graph.num_stages, graph.num_microbatches
    where: dict[tuple[int, ActionKind, int], tuple[int, int]] = {}
    for rank, row in enumerate(actions):
        for step, item in enumerate(row):
            for action in parts(item):
                stage, kind, mb = action.stage, action.kind, action.microbatch
                key = (stage, kind, mb)
                before = _PREREQUISITE.get(kind)
                if (
                    stage >= num_stages
                    or mb >= num_microbatches
                    or graph.rank_of_stage(stage) != rank
                    or not graph.visits(stage, mb)
                    or key in where
                    or (before is not None and (stage, before, mb) not in where)
                ):
                    at = f"rank {rank}, step {step}: {action}"
                    problem = _placement_problem(action, rank, where, graph=graph)
                    _fail(f"{at} {problem}", actions, step=step, rank=rank)
                where[key] = (rank, step)
    return where


def _placement_problem(
    action: Action,
    rank: int,
    where: dict[tuple[int, ActionKind, int], tuple[int, int]],
    *,
    graph: StageGraph,
) -> str:
    """Say what is wrong with an action that failed a placement check."""
    stage, mb = action.stage, action.microbatch
    num_stages, num_microbatches = graph.num_stages, graph.num_microbatches
    if stage >= num_stages or mb >= num_microbatches:
        return (
            f"is out of range (stages 0..{num_stages - 1}, micro-batches 0..{num_microbatches - 1})"
        )
    home = graph.rank_of_stage(stage)
    if home != rank:
        return f"is on the wrong rank: stage {stage} lives on rank {home}"
    if not graph.visits(stage, mb):
        return f"runs micro-batch {mb} through stage {stage} of the other model copy"
    if (stage, action.kind, mb) in where:
        return "is a duplicate"
    before = _PREREQUISITE[action.kind]
    return f"runs before {Action(stage=stage, kind=before, microbatch=mb)} on its rank"


def check_structure(
    actions: PerRankActions,
    *,
    num_stages: int,
    num_microbatches: int,
    placement: StagePlacement = StagePlacement.LOOP,
) -> None:
    """Check counts, placement and same-rank order (linear time; no deadlock check).

    Args:
        actions: per-rank action lists; ``len(actions)`` is the number of ranks.
        num_stages: pipeline stages (ranks * vpp; 2 * ranks for the V and dual placements).
        num_microbatches: micro-batches per step.
        placement: where the stages live (``plansim.specs.stage_placement``).

    Raises:
        ScheduleError: an action out of range, on the wrong rank, duplicated or out of order;
            a (stage, micro-batch) without F or without a backward; B mixed with I/W.
    """
    if not actions or num_stages % len(actions):
        raise ScheduleError(
            f"{len(actions)} ranks of actions for {num_stages} stages; "
            "stages must be a positive multiple of ranks"
        )
    graph = StageGraph(
        placement=placement,
        num_ranks=len(actions),
        num_stages=num_stages,
        num_microbatches=num_microbatches,
    )
    where = _check_placement(actions, graph=graph)
    for stage in range(num_stages):
        for mb in range(num_microbatches):
            if not graph.visits(stage, mb):
                continue
            full = (stage, _B, mb) in where
            split = (stage, _I, mb) in where, (stage, _W, mb) in where
            if (stage, _F, mb) not in where or full == any(split) or not (full or all(split)):
                _check_complete(actions, where, stage=stage, microbatch=mb, graph=graph)


def _check_complete(
    actions: PerRankActions,
    where: dict[tuple[int, ActionKind, int], tuple[int, int]],
    *,
    stage: int,
    microbatch: int,
    graph: StageGraph,
) -> None:
    """One F and either one B or one I plus one W for (stage, microbatch); else fail."""
    has = {kind for kind in ActionKind if (stage, kind, microbatch) in where}
    if _B in has and has & {_I, _W}:
        rank, step = where[(stage, _B, microbatch)]
        _fail(
            f"rank {rank}, step {step}: {stage}B{microbatch} mixed with a split backward "
            "(I/W) of the same stage and micro-batch",
            actions,
            step=step,
            rank=rank,
        )
    if _F in has and (_B in has or {_I, _W} <= has):
        return
    if _F not in has:
        missing = "F"
    elif has & {_I, _W}:
        missing = "W" if _I in has else "I"
    else:
        missing = "B"
    _fail(
        f"missing action {stage}{missing}{microbatch} (stage {stage} lives on rank "
        f"{graph.rank_of_stage(stage)}): every (stage, micro-batch) needs one F and one B "
        "(or one I and one W)",
        actions,
    )


def lockstep_grid(
    actions: PerRankActions,
    *,
    num_stages: int,
    graph: StageGraph | None = None,
) -> tuple[tuple[ScheduleItem | None, ...], ...]:
    """Run the lists in lockstep with unit-time items; return the timestep grid.

    At each timestep every rank runs its next item if the signals it needs (see
    :func:`needs`; ``graph``: the micro-batches' paths, None for stages in order) were
    produced at an earlier timestep; otherwise it idles (None).

    Raises:
        ScheduleError: no rank can run while actions remain (deadlock).
    """
    pos = [0] * len(actions)
    done: set[SignalKey] = set()
    grid: list[list[ScheduleItem | None]] = [[] for _ in actions]
    remaining = sum(len(row) for row in actions)
    while remaining:
        produced: list[SignalKey] = []
        ran = False
        for rank, row in enumerate(actions):
            if pos[rank] == len(row):
                continue
            item = row[pos[rank]]
            if any(key not in done for key in item_needs(item, num_stages=num_stages, graph=graph)):
                grid[rank].append(None)
                continue
            grid[rank].append(item)
            pos[rank] += 1
            remaining -= 1
            ran = True
            for action in parts(item):
                signal = provides(action)
                if signal is not None:
                    produced.append(signal)
        if not ran:
            _deadlock(actions, grid, pos, num_stages=num_stages, graph=graph)
        done.update(produced)
    return tuple(tuple(row) for row in grid)


def describe_wait(
    item: ScheduleItem,
    rank: int,
    *,
    num_ranks: int,
    num_stages: int,
    graph: StageGraph | None = None,
) -> str:
    """Say what ``item`` (next on ``rank``) waits for, e.g. 'rank 0 waits at 0B0 for 1B0/1I0
    (rank 1)'; used in deadlock messages of the checks and the engine."""
    waits = item_needs(item, num_stages=num_stages, graph=graph)
    if not waits:
        return f"rank {rank} stopped at {item}"
    named = []
    for signal, stage, mb in waits:
        producer = f"{stage}F{mb}" if signal is Signal.ACTIVATION else f"{stage}B{mb}/{stage}I{mb}"
        home = graph.rank_of_stage(stage) if graph is not None else stage % num_ranks
        named.append(f"{producer} (rank {home})")
    return f"rank {rank} waits at {item} for {' and '.join(named)}"


def _deadlock(
    actions: PerRankActions,
    grid: Sequence[Sequence[ScheduleItem | None]],
    pos: Sequence[int],
    *,
    num_stages: int,
    graph: StageGraph | None,
) -> NoReturn:
    step = max(len(row) for row in grid) - 1
    stalled = [(rank, row[pos[rank]]) for rank, row in enumerate(actions) if pos[rank] < len(row)]
    shown = [list(row) for row in grid]
    for rank, action in stalled:
        shown[rank][step] = action
    waits = "; ".join(
        describe_wait(a, r, num_ranks=len(actions), num_stages=num_stages, graph=graph)
        for r, a in stalled
    )
    table = format_grid(shown, error_step=step, flagged=[(r, step) for r, _ in stalled])
    raise ScheduleError(
        f"schedule deadlocks at timestep {step}: {waits}\n\n"
        f"Pipeline schedule (timestep x rank, unit-time lockstep):\n{table}"
    )


def check_actions(
    actions: PerRankActions,
    *,
    num_microbatches: int,
    vpp: int = 1,
    placement: StagePlacement = StagePlacement.LOOP,
) -> None:
    """Check every invariant: :func:`check_structure`, then a deadlock-free :func:`lockstep_grid`.

    Args:
        actions: per-rank action lists; stages = ``len(actions) * vpp`` (loop), or twice the
            ranks (V and dual placements, which hold two chunks per rank).
        num_microbatches: micro-batches per step.
        vpp: model chunks per rank (loop placement).
        placement: where the stages live.

    Raises:
        ScheduleError: the first violation found, with the grid in the message.
    """
    per_rank = vpp if placement is StagePlacement.LOOP else 2
    num_stages = len(actions) * per_rank
    check_structure(
        actions, num_stages=num_stages, num_microbatches=num_microbatches, placement=placement
    )
    graph = StageGraph(
        placement=placement,
        num_ranks=len(actions),
        num_stages=num_stages,
        num_microbatches=num_microbatches,
    )
    lockstep_grid(actions, num_stages=num_stages, graph=graph)
