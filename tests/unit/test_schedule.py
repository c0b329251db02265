"""Actions, builders and invariant checks of pipeline schedules."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from plansim.errors import InputFileError, SpecError
from plansim.schedule import (
    Action,
    ActionKind,
    ScheduleError,
    build_actions,
    check_actions,
    format_actions_csv,
    format_grid,
    lockstep_grid,
    parse_actions_csv,
)
from plansim.schedule.actions import PerRankActions
from plansim.specs.plan import Schedule

#: The schedules with one model chunk per rank (vpp == 1).
#: One model chunk per rank, looped placement (the V and dual schedules: test_dualpipe.py).
FLAT = [Schedule.GPIPE, Schedule.ONE_F_ONE_B, Schedule.ZB_H1]
#: The flat schedules with an unsplit backward (B); ZB-H1 splits it (see test_zero_bubble.py).
FULL_BACKWARD = [Schedule.GPIPE, Schedule.ONE_F_ONE_B]


def acts(*rows: str) -> PerRankActions:
    """Per-rank actions from space-separated action strings, one string per rank."""
    return tuple(tuple(Action.parse(s) for s in row.split()) for row in rows)


def strs(actions: PerRankActions) -> list[list[str]]:
    return [[str(a) for a in row] for row in actions]


# --- Action ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "stage", "kind", "microbatch"),
    [
        ("0F1", 0, ActionKind.FORWARD, 1),
        ("1B0", 1, ActionKind.FULL_BACKWARD, 0),
        ("0W2", 0, ActionKind.BACKWARD_WEIGHT, 2),
        ("2I0", 2, ActionKind.BACKWARD_INPUT, 0),
        ("12F345", 12, ActionKind.FORWARD, 345),
    ],
)
def test_action_parse_and_format_round_trip(
    text: str, stage: int, kind: ActionKind, microbatch: int
) -> None:
    action = Action.parse(text)
    assert action == Action(stage=stage, kind=kind, microbatch=microbatch)
    assert str(action) == text
    assert Action.parse(f"  {text} ") == action


def test_action_kind_letters_are_torchs() -> None:
    # torch.distributed.pipelining.schedules._ComputationType: F, I, W, B (full backward)
    assert {k.name: k.value for k in ActionKind} == {
        "FORWARD": "F",
        "FULL_BACKWARD": "B",
        "BACKWARD_INPUT": "I",
        "BACKWARD_WEIGHT": "W",
    }


@pytest.mark.parametrize("text", ["", "F1", "0X1", "0F", "-1F0", "0F1x", "0 F 1", "1REDUCE_GRAD"])
def test_action_parse_rejects_malformed(text: str) -> None:
    with pytest.raises(SpecError, match="malformed action") as info:
        Action.parse(text)
    assert repr(text) in str(info.value)


def test_action_rejects_negative_index() -> None:
    with pytest.raises(SpecError, match=r"action\.microbatch"):
        Action(stage=0, kind=ActionKind.FORWARD, microbatch=-1)


# --- CSV and grid ------------------------------------------------------------------------


def test_csv_round_trip_and_layout() -> None:
    actions = acts("0F0 0F1 0B0 0B1", "1F0 1B0 1F1 1B1")
    text = format_actions_csv(actions)
    assert text == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n"
    assert parse_actions_csv(text) == actions


def test_csv_idle_cells_are_empty_and_dropped() -> None:
    grid = [[Action.parse("0F0"), None, Action.parse("0B0")], [None, Action.parse("1F0")]]
    text = format_actions_csv(grid)
    assert text == "0F0,,0B0\n,1F0\n"
    assert strs(parse_actions_csv(text)) == [["0F0", "0B0"], ["1F0"]]


def test_csv_malformed_cell_names_row_and_column() -> None:
    with pytest.raises(InputFileError, match=r"plan\.csv: row 1 \(rank\), column 2"):
        parse_actions_csv("0F0,0B0\n1F0,1B0,1Q1\n", source="plan.csv")


def test_format_grid_matches_torch_layout() -> None:
    grid = [[Action.parse("0F0"), Action.parse("0B0")], [None, Action.parse("1F0")]]
    assert format_grid(grid, error_step=1, flagged=[(1, 1)]) == (
        "        Rank 0 Rank 1\nStep 0: 0F0\nStep 1: 0B0    [1F0] <-- ERROR HERE\n"
    )


# --- builders ----------------------------------------------------------------------------


def test_gpipe_order() -> None:
    actions = build_actions(Schedule.GPIPE, num_ranks=3, num_microbatches=2)
    assert strs(actions) == [
        ["0F0", "0F1", "0B0", "0B1"],
        ["1F0", "1F1", "1B0", "1B1"],
        ["2F0", "2F1", "2B0", "2B1"],
    ]


def test_one_f_one_b_order() -> None:
    # Narayanan et al. SC21 Fig. 4 (top): warm-up p - r - 1 forwards, F/B pairs, cool-down.
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=4, num_microbatches=6)
    assert strs(actions) == [
        ["0F0", "0F1", "0F2", "0F3", "0B0", "0F4", "0B1", "0F5", "0B2", "0B3", "0B4", "0B5"],
        ["1F0", "1F1", "1F2", "1B0", "1F3", "1B1", "1F4", "1B2", "1F5", "1B3", "1B4", "1B5"],
        ["2F0", "2F1", "2B0", "2F2", "2B1", "2F3", "2B2", "2F4", "2B3", "2F5", "2B4", "2B5"],
        ["3F0", "3B0", "3F1", "3B1", "3F2", "3B2", "3F3", "3B3", "3F4", "3B4", "3F5", "3B5"],
    ]


def test_one_f_one_b_with_fewer_microbatches_than_ranks() -> None:
    actions = build_actions(Schedule.ONE_F_ONE_B, num_ranks=4, num_microbatches=2)
    assert strs(actions) == [
        ["0F0", "0F1", "0B0", "0B1"],
        ["1F0", "1F1", "1B0", "1B1"],
        ["2F0", "2F1", "2B0", "2B1"],
        ["3F0", "3B0", "3F1", "3B1"],
    ]


def _max_in_flight(row: tuple[Action, ...]) -> int:
    live = peak = 0
    for action in row:
        live += 1 if action.kind is ActionKind.FORWARD else -1
        peak = max(peak, live)
    return peak


@pytest.mark.parametrize(("p", "m"), [(4, 8), (4, 2), (8, 8), (1, 3)])
def test_in_flight_microbatches(p: int, m: int) -> None:
    one_f_one_b = build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m)
    gpipe = build_actions(Schedule.GPIPE, num_ranks=p, num_microbatches=m)
    assert [_max_in_flight(row) for row in one_f_one_b] == [min(p - r, m) for r in range(p)]
    assert [_max_in_flight(row) for row in gpipe] == [m] * p


@pytest.mark.parametrize("schedule", FULL_BACKWARD)
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 1), (2, 2), (4, 3), (4, 9), (8, 32)])
def test_built_schedules_pass_checks_and_take_2_m_plus_p_minus_1_steps(
    schedule: Schedule, p: int, m: int
) -> None:
    actions = build_actions(schedule, num_ranks=p, num_microbatches=m)
    check_actions(actions, num_microbatches=m)
    grid = lockstep_grid(actions, num_stages=p)
    assert max(len(row) for row in grid) == 2 * (m + p - 1)


@pytest.mark.parametrize("schedule", FLAT)
def test_flat_schedules_refuse_vpp_above_one(schedule: Schedule) -> None:
    message = f"schedule {schedule.value} needs vpp == 1 (got vpp=2); use interleaved-1f1b"
    with pytest.raises(SpecError) as info:
        build_actions(schedule, num_ranks=4, num_microbatches=8, vpp=2)
    assert str(info.value) == message


def test_interleaved_order() -> None:
    # Worked by hand from Megatron-LM's rule (Narayanan et al. SC21 §2.2.2): p = 2, v = 2,
    # m = 4; rank r holds stages r (chunk 0) and 2 + r (chunk 1). Forward k runs chunk
    # (k // 2) % 2 on micro-batch (k // 4) * 2 + k % 2; backward k the other chunk first.
    # Warm-up: rank 0 2*(2-0-1) + (2-1)*2 = 4 forwards, rank 1 0 + 2 = 2.
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=2, num_microbatches=4, vpp=2)
    assert [" ".join(row) for row in strs(actions)] == [
        "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3",
        "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3",
    ]


@pytest.mark.parametrize(("p", "v", "m"), [(2, 2, 2), (2, 2, 4), (4, 2, 8), (3, 3, 6), (4, 4, 4)])
def test_interleaved_passes_checks_and_takes_2_m_v_plus_2_p_minus_2_steps(
    p: int, v: int, m: int
) -> None:
    # Unit-time lockstep: each rank computes 2 m v chunk steps; the bubble is (p - 1)(F + B)
    # per rank with F = B = v chunk steps per micro-batch divided by v (Narayanan §2.2.2).
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v)
    check_actions(actions, num_microbatches=m, vpp=v)
    grid = lockstep_grid(actions, num_stages=p * v)
    assert max(len(row) for row in grid) == 2 * m * v + 2 * (p - 1)
    for rank, row in enumerate(actions):
        assert {a.stage for a in row} == {c * p + rank for c in range(v)}


@pytest.mark.parametrize(("p", "v", "m"), [(4, 2, 8), (4, 2, 4), (4, 3, 12), (2, 4, 2)])
def test_interleaved_in_flight_chunks(p: int, v: int, m: int) -> None:
    # Megatron warm-up w = min(2(p - r - 1) + (v - 1)p, m v); one more chunk is stored by the
    # first steady-state forward before the first backward frees one.
    actions = build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v)
    expected = [min(min(2 * (p - r - 1) + (v - 1) * p, m * v) + 1, m * v) for r in range(p)]
    assert [_max_in_flight(row) for row in actions] == expected


@pytest.mark.parametrize(
    ("p", "m", "v", "message"),
    [
        (4, 6, 2, "needs num_microbatches(6) to be a multiple of the pipeline ranks pp(4)"),
        (4, 8, 1, "needs vpp > 1 (got vpp=1); use 1f1b"),
    ],
)
def test_interleaved_builder_rejects_bad_counts(p: int, m: int, v: int, message: str) -> None:
    with pytest.raises(SpecError, match=re.escape(message)):
        build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v)


@pytest.mark.parametrize("field", ["num_ranks", "num_microbatches", "vpp"])
def test_builder_rejects_non_positive_counts(field: str) -> None:
    kwargs = {"num_ranks": 2, "num_microbatches": 2, "vpp": 1} | {field: 0}
    with pytest.raises(SpecError, match=field):
        build_actions(Schedule.GPIPE, **kwargs)


# --- invariant checks --------------------------------------------------------------------


def _assert_grid_error(info: pytest.ExceptionInfo[ScheduleError], *needles: str) -> None:
    message = str(info.value)
    assert "Rank 0" in message and "Rank 1" in message and "Step 0" in message
    for needle in needles:
        assert needle in message, message


def test_missing_backward_is_reported_with_grid() -> None:
    actions = acts("0F0 0F1 0B0", "1F0 1B0 1F1 1B1")
    with pytest.raises(ScheduleError) as info:
        check_actions(actions, num_microbatches=2)
    _assert_grid_error(info, "missing action 0B1", "0F1")


def test_action_on_wrong_rank_is_reported_with_grid() -> None:
    actions = acts("0F0 0B0 1F1", "1F0 1B0 1B1")
    with pytest.raises(ScheduleError) as info:
        check_actions(actions, num_microbatches=2)
    _assert_grid_error(info, "rank 0, step 2: 1F1 is on the wrong rank", "[1F1]")


def test_duplicate_and_backward_before_forward_are_reported() -> None:
    with pytest.raises(ScheduleError, match="0F0 is a duplicate"):
        check_actions(acts("0F0 0F0 0B0", "1F0 1B0"), num_microbatches=1)
    with pytest.raises(ScheduleError, match="0B0 runs before 0F0"):
        check_actions(acts("0B0 0F0", "1F0 1B0"), num_microbatches=1)
    with pytest.raises(ScheduleError, match="0W0 runs before 0I0"):
        check_actions(acts("0F0 0W0 0I0", "1F0 1B0"), num_microbatches=1)


def test_split_backward_rules() -> None:
    check_actions(acts("0F0 0I0 0W0", "1F0 1I0 1W0"), num_microbatches=1)
    with pytest.raises(ScheduleError, match="missing action 0W0"):
        check_actions(acts("0F0 0I0", "1F0 1B0"), num_microbatches=1)
    with pytest.raises(ScheduleError, match="mixed with a split backward"):
        check_actions(acts("0F0 0I0 0B0 0W0", "1F0 1B0"), num_microbatches=1)


def test_deadlock_is_reported_with_lockstep_grid() -> None:
    # Rank 1 runs micro-batch 1 first; rank 0 waits for 1B0 before it sends 0F1.
    actions = acts("0F0 0B0 0F1 0B1", "1F1 1B1 1F0 1B0")
    with pytest.raises(ScheduleError) as info:
        check_actions(actions, num_microbatches=2)
    _assert_grid_error(
        info,
        "deadlocks at timestep 1",
        "rank 0 waits at 0B0 for 1B0/1I0",
        "rank 1 waits at 1F1 for 0F1",
        "Step 1: [0B0]  [1F1] <-- ERROR HERE",
    )


def test_lockstep_grid_of_gpipe() -> None:
    grid = lockstep_grid(
        build_actions(Schedule.GPIPE, num_ranks=2, num_microbatches=2), num_stages=2
    )
    assert [[str(a) if a else "" for a in row] for row in grid] == [
        ["0F0", "0F1", "", "", "0B0", "0B1"],
        ["", "1F0", "1F1", "1B0", "1B1"],
    ]


# --- torch.distributed.pipelining cross-check (skipped without torch) --------------------

_COMPUTE_LETTERS = {kind.value for kind in ActionKind}


def _torch_compute_order(schedule_cls: type, p: int, m: int) -> list[list[str]]:
    """torch's planned order per rank (compute actions only), built without a process group.

    ``PipelineScheduleSingle._get_pipeline_order`` reads only ``_num_stages`` and
    ``_n_microbatches``, so it runs on a stand-in object instead of a real stage.
    """
    planner = getattr(schedule_cls, "_get_pipeline_order", None)
    if planner is None:
        pytest.skip(f"this torch's {schedule_cls.__name__} does not expose _get_pipeline_order")
    order = planner(SimpleNamespace(_num_stages=p, _n_microbatches=m))
    if order is None:
        pytest.skip(f"this torch's {schedule_cls.__name__} plans no pipeline order")
    return [
        [str(a) for a in order[rank] if a is not None and a.computation_type in _COMPUTE_LETTERS]
        for rank in range(p)
    ]


@pytest.mark.parametrize(("p", "m"), [(2, 2), (4, 4), (4, 8), (3, 7)])
def test_orders_match_torch(p: int, m: int) -> None:
    pytest.importorskip("torch")
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    gpipe = build_actions(Schedule.GPIPE, num_ranks=p, num_microbatches=m)
    assert strs(gpipe) == _torch_compute_order(schedules.ScheduleGPipe, p, m)
    ours = strs(build_actions(Schedule.ONE_F_ONE_B, num_ranks=p, num_microbatches=m))
    theirs = _torch_compute_order(schedules.Schedule1F1B, p, m)
    assert ours[:-1] == theirs[:-1]
    # torch 2.13's Schedule1F1B._get_pipeline_order (the IR, not what runs) plans the last
    # rank as F1 B0 F2 B1 ... F<m> B<m-1>: forward_mb starts at 0 and is incremented before
    # use when there is no warm-up. Its _step_microbatches, which runs, does F0 B0 F1 B1 ...
    # there, as we do. Compare the last rank only where torch's plan is a valid one.
    assert ours[-1] == [f"{p - 1}{k}{j}" for j in range(m) for k in "FB"]
    if sorted(theirs[-1]) == sorted(ours[-1]):
        assert ours[-1] == theirs[-1]


def _torch_interleaved_order(schedule_cls: type, p: int, v: int, m: int) -> list[list[str]]:
    """torch's ``ScheduleInterleaved1F1B`` planned order per rank (compute actions only).

    ``_calculate_single_rank_operations`` reads only the fields its ``__init__`` sets from
    the stages (group size, local stages, rounds), so it runs on a stand-in object; the
    stand-in repeats torch's own round arithmetic.
    """
    planner = getattr(schedule_cls, "_calculate_single_rank_operations", None)
    if planner is None:
        pytest.skip(f"this torch's {schedule_cls.__name__} has no per-rank planner")
    rounds = max(1, m // p)
    fake = SimpleNamespace(
        pp_group_size=p, n_local_stages=v, _n_microbatches=m, microbatches_per_round=m // rounds
    )
    return [
        [str(a) for a in planner(fake, rank) if a is not None and a.computation_type in "FBIW"]
        for rank in range(p)
    ]


@pytest.mark.parametrize(
    ("p", "v", "m"), [(2, 2, 2), (2, 2, 4), (4, 2, 8), (4, 3, 4), (3, 4, 9), (8, 2, 16)]
)
def test_interleaved_orders_match_torch(p: int, v: int, m: int) -> None:
    pytest.importorskip("torch")
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    ours = strs(build_actions(Schedule.INTERLEAVED_1F1B, num_ranks=p, num_microbatches=m, vpp=v))
    assert ours == _torch_interleaved_order(schedules.ScheduleInterleaved1F1B, p, v, m)


@pytest.mark.parametrize("schedule", [*FLAT, Schedule.INTERLEAVED_1F1B])
def test_our_lists_pass_torchs_validator(schedule: Schedule) -> None:
    pytest.importorskip("torch")
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    validate = getattr(schedules, "_validate_schedule", None)
    if validate is None:
        pytest.skip("this torch has no _validate_schedule")
    p, m, v = 4, 8, (2 if schedule.interleaved else 1)
    actions = build_actions(schedule, num_ranks=p, num_microbatches=m, vpp=v)
    torch_order = {
        rank: [schedules._Action.from_str(str(a)) for a in row] for rank, row in enumerate(actions)
    }
    assert [[str(a) for a in torch_order[r]] for r in range(p)] == strs(actions)
    stage_to_rank = validate(torch_order, p, p * v, m)
    assert stage_to_rank == {s: s % p for s in range(p * v)}
